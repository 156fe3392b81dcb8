//! The evict/restore bench program (`bench/evict_restore.c`, run by `elastic-bench` and `bench/real_gpu.sh`)
//! on the simulator: the sequence it times keeps every byte at the same address, with a fresh host allocation
//! per eviction and with one kept; its unified-memory baseline pages every tenant back without a failure.
//! Figures are not checked here (they are the host's on the simulator: bench/README.md).
//!
//! Needs the debug `libcudasim.so` (`cargo build -p cuquota-sim`); no libcuquota.so is loaded.

use shim_tests::{compile_c, workspace_root, Sim};
use std::path::PathBuf;
use std::time::Duration;

fn program() -> PathBuf {
    let root = workspace_root();
    compile_c(
        "evict_restore",
        &root.join("bench/evict_restore.c"),
        &[&root.join("bench/elastic_common.h")],
        &["-lcuda", "-ldl"],
    )
}

#[test]
fn every_byte_survives_eviction_and_restore_at_the_same_address() {
    let sim = Sim::new()
        .memory("256m")
        .env("CUDASIM_H2D_GBPS", "25")
        .env("CUDASIM_D2H_GBPS", "25")
        .build();
    for pool in ["", "pool"] {
        let out = sim
            .cmd_path(program())
            .no_preload()
            .args(&format!("16 3 {pool}"))
            .timeout(Duration::from_secs(120))
            .run();
        assert!(out.success(), "{out:?}");
        out.expect("intact", "1").expect("cycles", "3");
        assert_eq!(out.num("bytes"), 16 << 20, "{out:?}");
    }
}

/// Managed memory 3.2 times the device, woken round-robin: every wake-up pages its tenant back in (none fails),
/// and each tenant's bytes count its own wake-ups.
#[test]
fn unified_memory_baseline_pages_every_tenant_back() {
    let sim = Sim::new()
        .memory("40m")
        .env("CUDASIM_MANAGED", "migrate")
        .env("CUDASIM_H2D_GBPS", "25")
        .build();
    let out = sim
        .cmd_path(program())
        .no_preload()
        .args("managed 16 8 12")
        .timeout(Duration::from_secs(120))
        .run();
    assert!(out.success(), "{out:?}");
    out.expect("failures", "0").expect("intact", "1");
    // 16 MiB at 25 GB/s plus 8 units' fault cost: about 0.83 ms; a wake-up that paged nothing in takes 1 us.
    assert!(out.num("wake_ns") > 600_000, "{out:?}");
}

/// Fail closed: a size, count or mode it does not know stops it, naming what was wrong.
#[test]
fn bad_arguments_are_refused_naming_them() {
    let sim = Sim::new().build();
    for (args, says) in [
        ("0 3", "invalid SIZE_MIB=0"),
        ("16 x", "invalid CYCLES=x"),
        ("16 3 pooled", "usage: evict_restore"),
        ("managed 16 99 4", "invalid TENANTS=99"),
    ] {
        let out = sim.cmd_path(program()).no_preload().args(args).run();
        assert_eq!(out.status.code(), Some(2), "{args}:{out:?}");
        assert!(out.stderr.contains(says), "{args}:{out:?}");
    }
}
