//! #21 items 1–3: the driver's figure is the last word on memory (`src/memory/reconcile.rs`). Each attack
//! (`c/reconcile.c`) makes the driver take memory on a path no allocation call names — a lazily loaded global,
//! a kernel's first launch, the stack grown for a kernel with large local memory, a call that bypasses the
//! shim altogether — or allocates from another device's pool; then fills the device with 64 MiB allocations.
//! Judged by the simulator's own used bytes against the 1 GiB cap; the control (no cap) shows how much the
//! attack would hold.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

const OK: &str = "CUDA_SUCCESS";
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

fn prog() -> PathBuf {
    compile_c(
        "reconcile",
        &workspace_root().join("shim-tests/c/reconcile.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

/// Runs `reconcile ARGS` on `sim` with `env`.
fn run(sim: &Sim, args: &str, env: &[(&str, &str)]) -> Output {
    let mut c = sim.cmd_path(prog()).args(args);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    out
}

const CAP: &[(&str, &str)] = &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")];

/// A global the driver allocates at `cuLibraryGetGlobal` (lazy loading): charged at that call, so the fill
/// after it stops at the cap.
#[test]
fn a_lazily_loaded_global_is_charged_at_first_use() {
    let sim = Sim::new().build();
    let control = run(&sim, "lazy_global 512m 64m", &[]);
    assert!(control.peak("used") > 2 * GIB, "control:{control:?}");
    let sim = Sim::new().build();
    let out = run(&sim, "lazy_global 512m 64m", CAP);
    out.expect("global.0", OK);
    assert!(out.num("fill.count") >= 1, "{out:?}");
    out.assert_used_within(GIB);
}

/// Library after library of 2 GiB globals under a 1 GiB cap: the first lazy load cannot be known in advance
/// (it is charged once taken), every later one is refused before the driver is asked.
#[test]
fn lazy_loads_over_the_cap_are_refused() {
    let sim = Sim::new().build();
    let out = run(&sim, "lazy_global 2g 64m 3", CAP);
    out.expect("global.1", OOM).expect("global.2", OOM);
    assert_eq!(out.num("fill.count"), 0, "{out:?}");
    assert_eq!(out.num("info.free"), 0, "{out:?}");
    // The context, one library's module and its global: nothing more.
    out.assert_used_within(GIB + 2 * GIB);
}

/// A CUkernel's first launch loads its library into the context (the CUDA runtime's path): measured after the
/// launch.
#[test]
fn a_first_launch_is_measured() {
    let sim = Sim::new().build();
    let control = run(&sim, "lazy_launch 512m 64m", &[]);
    assert!(control.peak("used") > 2 * GIB, "control:{control:?}");
    let sim = Sim::new().build();
    let out = run(&sim, "lazy_launch 512m 64m", CAP);
    out.expect("launch", OK);
    out.assert_used_within(GIB);
}

/// Per-thread local memory above the stack size: the driver grows the stack for every thread the device holds
/// (132 SMs × 2048 threads on the simulator) at the launch. 3010 bytes: ~512 MiB more, admitted before the
/// launch; 16 KiB: ~4 GiB, refused before the driver is asked.
#[test]
fn stack_growth_at_launch_is_admitted() {
    let sim = Sim::new().build();
    let control = run(&sim, "stack 3010 64m", &[]);
    assert!(control.peak("used") > 2 * GIB, "control:{control:?}");
    let sim = Sim::new().build();
    let out = run(&sim, "stack 3010 64m", CAP);
    out.expect("launch", OK);
    out.assert_used_within(GIB);

    let sim = Sim::new().build();
    let out = run(&sim, "stack 16384 64m", CAP);
    out.expect("launch", OOM);
    out.assert_used_within(GIB);
}

/// Device 1's default pool used from device 0's stream: charged to device 1 (cap 1 GiB), not to device 0
/// (cap 8 GiB), whatever the stream.
#[test]
fn a_pool_allocation_is_charged_to_the_pools_device() {
    let sim = Sim::new().devices(2).build();
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "8g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
    ];
    let out = run(&sim, "pool_other 64 64m", &env);
    let used1 = out.num("used1");
    assert!(
        used1 <= GIB,
        "device 1 holds {} MiB under its 1 GiB cap:{out:?}",
        used1 / MIB
    );
    assert!(out.num("pool.ok") >= 8, "{out:?}");
}

/// Memory no hook sees (libcuda's own cuMemAlloc_v2, found in its ELF symbol table): an admission near the cap
/// reconciles with NVML. 200 MiB, within the 256 MiB margin, is charged before the container passes the cap;
/// 600 MiB overshoots it by at most 600 − 256 MiB (the staleness bound: `U − margin`).
#[test]
fn memory_no_hook_sees_is_charged_near_the_cap() {
    let sim = Sim::new().build();
    let out = run(&sim, "bypass 200m 64m", CAP);
    out.expect("bypass", OK);
    out.assert_used_within(GIB);

    let sim = Sim::new().build();
    let out = run(&sim, "bypass 600m 64m", CAP);
    out.expect("bypass", OK);
    let bound = GIB + 600 * MIB - 256 * MIB;
    println!(
        "bypass 600m: peak {} MiB, bound {} MiB",
        out.peak("used") / MIB,
        bound / MIB
    );
    out.assert_used_within(bound);
    assert_eq!(out.num("info.free"), 0, "{out:?}");
}
