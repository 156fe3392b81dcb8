//! #11 class 1, the lifetime of virtual-memory-management allocations: memory made with `cuMemCreate` lives
//! until every handle reference is released (`cuMemCreate`'s and one per `cuMemRetainAllocationHandle`) and
//! every mapping is unmapped (cuda.h on `cuMemRelease`). The attack (`c/vmm_lifetime.c`): create 512 MiB, map
//! it, release the handle and keep using the mapping, then allocate 768 MiB more under a 1 GiB cap. A shim that
//! un-charges at `cuMemRelease` grants it, and the simulated GPU — the ground truth, its NVML used bytes read
//! past the shim — holds 1280 MiB for a container capped at 1 GiB. The charge now follows the physical
//! allocation until it is really gone.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const OK: &str = "CUDA_SUCCESS";

fn attack() -> PathBuf {
    compile_c(
        "vmm_lifetime",
        &workspace_root().join("shim-tests/c/vmm_lifetime.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

/// Runs `vmm_lifetime` with `cmds` under a 1 GiB cap on a fresh 16 GiB simulator.
fn run(cmds: &str) -> Output {
    run_with(cmds, &[])
}

fn run_with(cmds: &str, env: &[(&str, &str)]) -> Output {
    let sim = Sim::new().build();
    let mut c = sim.cmd_path(attack()).mem_limit("1g").args(cmds);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    out.ok();
    out
}

/// At each `charged used` pair, the shim's charge equals what the driver holds (no context overhead here).
#[track_caller]
fn exact(out: &Output) {
    let charged = out.all("charged");
    assert_eq!(charged, out.all("used"), "charge ≠ the driver's figure:\n{out:?}");
    assert!(!charged.is_empty(), "{out:?}");
}

#[test]
fn released_but_still_mapped_memory_stays_charged() {
    let out = run("create:0:512m map:0:0 release:0 charged used alloc:768m charged used");
    out.expect("create.0", OK)
        .expect("map.0", OK)
        .expect("release.0", OK);
    // The driver still holds the 512 MiB (the mapping keeps it alive)...
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    // ...so 768 MiB more does not fit under 1 GiB.
    out.expect("alloc", OOM);
    out.assert_used_within(GIB);
    exact(&out);
}

#[test]
fn the_charge_goes_when_the_last_mapping_goes() {
    // Two mappings of one allocation: one charge; it goes with the second unmap, not the release or the first.
    let out = run("create:0:512m map:0:0 map:1:0 release:0 unmap:0 alloc:768m unmap:1 used alloc:768m used");
    out.expect("unmap.0", OK).expect("unmap.1", OK);
    assert_eq!(out.all("alloc"), vec![OOM, OK], "{out:?}");
    assert_eq!(out.nth_num("used", 0), 0, "{out:?}");
    assert_eq!(out.nth_num("used", 1), 768 * MIB, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn a_retained_handle_keeps_the_charge_until_its_own_release() {
    let out = run(
        "create:0:512m map:0:0 retain:1:0 release:0 unmap:0 charged used alloc:768m release:1 charged used \
         alloc:768m charged used",
    );
    out.expect("retain.1", OK).expect("retain.1.same", "1");
    out.expect("release.0", OK).expect("release.1", OK);
    // Released once and unmapped, the retained reference still holds the memory: on the GPU and in the charge.
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    assert_eq!(out.nth_num("used", 1), 0, "{out:?}");
    assert_eq!(out.all("alloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
    exact(&out);
}

#[test]
fn create_and_release_unmapped_still_gives_the_memory_back() {
    // The ordinary path: never mapped, released → gone at once, in the driver and in the charge.
    let out = run("create:0:768m release:0 used alloc:768m used");
    out.expect("release.0", OK).expect("alloc", OK);
    assert_eq!(out.nth_num("used", 0), 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn a_refused_unmap_or_release_keeps_the_charge_exact() {
    // The driver refuses the first cuMemUnmap: the mapping (and the memory) stays, so does the charge.
    let out = run_with(
        "create:0:256m map:0:0 release:0 unmap:0 charged used unmap:0 charged used",
        &[("CUDASIM_FAULT", "cuMemUnmap:1:DEVICE_LOST")],
    );
    assert_eq!(out.all("unmap.0"), vec!["CUDA_ERROR_UNKNOWN", OK], "{out:?}");
    assert_eq!(out.nth_num("used", 0), 256 * MIB, "{out:?}");
    exact(&out);
    // The driver refuses the first cuMemRelease: the reference stays, so the unmap does not end the memory.
    let out = run_with(
        "create:0:256m map:0:0 release:0 unmap:0 charged used release:0 charged used",
        &[("CUDASIM_FAULT", "cuMemRelease:1:DEVICE_LOST")],
    );
    assert_eq!(out.all("release.0"), vec!["CUDA_ERROR_UNKNOWN", OK], "{out:?}");
    assert_eq!(out.nth_num("used", 0), 256 * MIB, "{out:?}");
    assert_eq!(out.nth_num("used", 1), 0, "{out:?}");
    exact(&out);
}

/// Issue 21: a handle bound to a sparse array's tile (`cuMemMapArrayAsync`) holds its memory as a mapping
/// does: released, it stays charged while bound (before, 768 MiB more fitted beside the 512 MiB the GPU still
/// held); the tile's unmap lets go of it, and then 768 MiB more fits (the control).
#[test]
fn a_released_handle_bound_to_a_sparse_array_stays_charged_until_unbound() {
    let out = run(
        "create:0:512m sparse:0:0 release:0 charged used alloc:768m charged used \
         tileunmap:0 charged used alloc:768m charged used",
    );
    out.assert_used_within(GIB);
    out.expect("sparse.0", OK)
        .expect("release.0", OK)
        .expect("tileunmap.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    assert_eq!(out.all("alloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
    exact(&out);
}

/// Destroying the sparse array unbinds its tiles: a released handle's memory goes with it.
#[test]
fn destroying_a_sparse_array_lets_go_of_what_was_bound_to_it() {
    let out = run("create:0:512m sparse:0:0 release:0 arraydestroy:0 charged used alloc:768m charged used");
    out.expect("arraydestroy.0", OK).expect("alloc", OK);
    assert_eq!(out.nth_num("used", 0), 0, "{out:?}");
    out.assert_used_within(GIB);
    exact(&out);
}

/// Issue 21: memory bound to a multicast object (`cuMulticastBindMem`, or `cuMulticastBindAddr` of a mapped
/// range then unmapped) stays charged after its handle is released, until `cuMulticastUnbind`.
#[test]
fn a_released_handle_bound_to_a_multicast_object_stays_charged_until_unbound() {
    let out = run(
        "create:0:512m mcbind:0:0 release:0 charged used alloc:768m charged used \
         mcunbind:0 charged used alloc:768m charged used",
    );
    out.assert_used_within(GIB);
    out.expect("mcbind.0", OK).expect("mcunbind.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    assert_eq!(out.all("alloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
    exact(&out);

    let out =
        run("create:0:512m map:0:0 mcbindaddr:0:0 release:0 unmap:0 charged used alloc:768m charged used");
    out.assert_used_within(GIB);
    out.expect("mcbind.0", OK).expect("unmap.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    out.expect("alloc", OOM);
    out.assert_used_within(GIB);
    exact(&out);
}
