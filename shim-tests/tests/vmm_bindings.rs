//! VMM memory held by bindings and graph execs updated to new memory nodes, under a 1 GiB cap
//! (`c/vmm_bindings.c`): each test judges by the simulator's own used bytes, with a control the cap does not
//! make pass (an exact unbind, a list that succeeds, no cuquota at all).

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn probe() -> PathBuf {
    compile_c(
        "vmm_bindings",
        &workspace_root().join("shim-tests/c/vmm_bindings.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

fn run(mode: &str, cap: bool) -> Output {
    let sim = Sim::new().build();
    let mut c = sim.cmd_path(probe()).arg(mode);
    c = if cap { c.mem_limit("1g") } else { c.no_preload() };
    let out = c.run();
    assert_eq!(out.val("done"), "1", "{out:?}");
    out
}

/// `cuMulticastUnbind(mc, dev, 0, 770 MiB)` unbinds, in the driver, only a binding made at exactly that offset
/// and size (cuda.h: they must match the bind's): the 768 MiB handle bound at 2 MiB stays bound after its
/// release and stays charged, so the 768 MiB alloc is refused.
#[test]
fn a_multicast_unbind_lets_go_only_of_the_binding_it_names_exactly() {
    let out = run("mcrange", true);
    assert_eq!(out.val("bind2"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("unbind"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// Control: unbinding exactly the 2 MiB binding: the 768 MiB handle stays charged and the 768 MiB alloc is
/// refused.
#[test]
fn a_multicast_exact_unbind_keeps_the_other_binding_charged() {
    let out = run("mcexact", true);
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// A `cuMemMapArrayAsync` list whose first entry binds a 768 MiB handle and whose second is invalid: the
/// driver (the simulator) applies the first and fails the call; the handle stays charged as bound after its
/// release (fail closed), so the 768 MiB alloc is refused.
#[test]
fn a_sparse_map_list_that_fails_part_way_keeps_its_handles_charged() {
    let out = run("sparsefail", true);
    assert_ne!(out.val("maparray"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// Control: the same bind alone succeeds and keeps the handle charged.
#[test]
fn a_sparse_map_keeps_the_bound_handle_charged() {
    let out = run("sparseok", true);
    assert_eq!(out.val("maparray"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// A sparse mipmapped array holds nothing until bound (shim and simulator agree): 512 MiB fits beside it; a
/// handle bound to its level 0 stays charged after its release, so a further 768 MiB is refused.
#[test]
fn a_sparse_mipmapped_array_is_charged_what_is_bound_to_it() {
    let out = run("sparsemip", true);
    assert_eq!(out.val("mipmap"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("created.used"), 0, "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("maparray"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("bound.used"), 768 * MIB, "{out:?}");
    assert_eq!(out.val("alloc2"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    out.assert_used_within(GIB);
}

/// A `cuMemMapArrayAsync` list said to hold 2^30 entries is refused, not copied (the process lives on).
#[test]
fn a_huge_sparse_map_list_is_refused_not_copied() {
    let out = run("hugecount", true);
    assert_eq!(out.val("maparray"), "CUDA_ERROR_INVALID_VALUE", "{out:?}");
}

/// `cuGraphExecUpdate` from a graph whose footprint cannot be walked (child graphs nested deeper than
/// `MAX_DEPTH`) is refused, as its instantiation would be: the 1536 MiB alloc node never runs under the cap.
#[test]
fn an_exec_update_to_a_graph_that_cannot_be_walked_is_refused() {
    let out = run("deepupdate", true);
    assert_eq!(out.val("instantiate"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("update"), "CUDA_ERROR_NOT_SUPPORTED", "{out:?}");
    assert!(out.num("reserved") <= 64 * MIB, "{out:?}");
    out.assert_used_within(GIB);
}

/// Control without cuquota: the update and launch really reserve 1536 MiB.
#[test]
fn an_exec_update_to_a_deep_graph_reserves_its_memory_without_cuquota() {
    let out = run("deepupdate", false);
    assert_eq!(out.val("update"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.val("launch"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("reserved"), 1536 * MIB, "{out:?}");
}

/// A handle bound to a multicast object, then the handle and the object released: the driver frees the memory
/// (the object's last release unbinds) and so does the shim: a 768 MiB alloc that fits is admitted.
#[test]
fn releasing_a_multicast_object_lets_go_of_what_was_bound() {
    let out = run("mcrelease", true);
    assert_eq!(out.val("mcrel"), "CUDA_SUCCESS", "{out:?}");
    assert_eq!(out.num("released.used"), 0, "{out:?}");
    assert_eq!(out.val("alloc"), "CUDA_SUCCESS", "{out:?}");
    out.assert_used_within(GIB);
}
