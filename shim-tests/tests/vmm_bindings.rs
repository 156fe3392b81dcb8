//! Hostile review of issue 21 item 4 (memory-bearing calls), `c/review_memcalls.c`. Each test asserts what the
//! limits promise (the simulator's own used bytes within the 1 GiB cap); the escapes FAIL on this branch.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn probe() -> PathBuf {
    compile_c(
        "review_memcalls",
        &workspace_root().join("shim-tests/c/review_memcalls.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

fn run(mode: &str, cap: bool) -> Output {
    let sim = Sim::new().build();
    let mut c = sim.cmd_path(probe()).arg(mode);
    if cap {
        c = c.mem_limit("1g");
    }
    let out = c.run();
    assert_eq!(out.val("done"), "1", "{out:?}");
    out
}

/// ESCAPE: `cuMulticastUnbind(mc, dev, 0, 770 MiB)` drops, in the shim, every binding whose offset lies in the
/// range (src/hooks/memory.rs `multicast_unbind`), while the driver (the simulator; cuda.h: "mcOffset and size
/// must match the bind") unbinds only the binding at offset 0. The 768 MiB handle bound at 2 MiB stays bound
/// and alive after its release, uncharged: 768 MiB more is admitted.
#[test]
fn review_multicast_unbind_of_a_wider_range_keeps_the_other_binding_charged() {
    let out = run("mcrange", true);
    assert_eq!(out.val("bind2"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("unbind"), "CUDA_SUCCESS", "{out:?}");
    out.assert_used_within(GIB);
}

/// Control: unbinding exactly the 2 MiB binding: the 768 MiB handle stays charged and the 768 MiB alloc is
/// refused.
#[test]
fn review_multicast_exact_unbind_control() {
    let out = run("mcexact", true);
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// ESCAPE: a `cuMemMapArrayAsync` list whose first entry binds a 768 MiB handle and whose second is invalid: the
/// simulator applies the first and fails the call; the shim records no binding for a failed call
/// (`map_array_async`), so the handle's release drops its charge while the array still holds it.
#[test]
fn review_sparse_map_that_fails_after_a_bind_keeps_the_bound_handle_charged() {
    let out = run("sparsefail", true);
    assert_ne!(out.val("maparray"), "CUDA_SUCCESS", "{out:?}");
    out.assert_used_within(GIB);
}

/// Control: the same bind alone succeeds and keeps the handle charged.
#[test]
fn review_sparse_map_control() {
    let out = run("sparseok", true);
    assert_eq!(out.val("maparray"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// ESCAPE: `cuGraphExecUpdate` from a graph whose footprint cannot be walked (child graphs nested deeper than
/// `MAX_DEPTH`; equally a graph destroyed by another thread right after the update returns) keeps the old
/// 64 MiB footprint (`hooks/graph_memory.rs` `changed`: logs and keeps, fail open), and the launch reserves
/// 1536 MiB under a 1 GiB cap. Instantiating such a graph is refused; updating to it is not.
#[test]
fn review_exec_update_to_an_unwalkable_graph_is_not_admitted() {
    let out = run("deepupdate", true);
    assert_eq!(out.val("instantiate"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("update"), "CUDA_SUCCESS", "{out:?}");
    out.assert_used_within(GIB);
}

/// Control without cuquota: the update and launch really reserve 1536 MiB.
#[test]
fn review_exec_update_deep_uncapped_control() {
    let out = run("deepupdate", false);
    assert_eq!(out.val("launch"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("reserved"), 1536 * MIB, "{out:?}");
}

/// CORRECTNESS (fail closed, but permanent): a handle bound to a multicast object, then the handle and the
/// object released: the driver frees the memory (the object's last release unbinds), the shim keeps charging
/// 512 MiB for the life of the process, and a 768 MiB alloc that fits is refused.
#[test]
fn review_releasing_a_multicast_object_lets_go_of_what_was_bound() {
    let out = run("mcrelease", true);
    assert_eq!(out.val("mcrel"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("released.used"), 0, "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_SUCCESS", "{out:?}");
}
