//! CUDA graph memory nodes under a memory cap: graph launches that reserve graph-pool memory are admitted
//! against the cap (refused → CUDA_ERROR_OUT_OF_MEMORY without calling the driver), the reservation is charged
//! once and reused across launches, and trim / exec destruction return the charge. Alloc nodes inside child
//! graphs (moved into the node, issue 21) and an exec updated from a graph with larger alloc nodes
//! (`cuGraphExecUpdate`) are admitted the same way: before, the simulated GPU held 1536 MiB under a 1 GiB cap.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn probe() -> PathBuf {
    compile_c(
        "graph_mem_probe",
        &workspace_root().join("shim-tests/c/graph_mem_probe.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

fn run(sim: &Sim, mode: &str) -> Output {
    let exe = probe();
    let out = sim.cmd_path(exe).arg(mode).mem_limit("1g").run();
    assert_eq!(out.val("done"), "1", "{out:?}");
    assert_eq!(out.val("init"), "0", "{out:?}");
    out
}

/// (a) + (c): a graph with an explicit 600m alloc node launches and cuMemGetInfo shows its reservation; a
/// second exec needing its own 600m is refused, and the driver's graph pool shows it was not asked.
#[test]
fn second_graph_reservation_over_the_cap_is_refused() {
    let sim = Sim::new().build();
    let out = run(&sim, "explicit");
    assert_eq!(out.val("launch_a"), "0", "600m under a 1g cap:{out:?}");
    assert_eq!(out.num("after_a.reserved"), 600 * MIB, "{out:?}");
    // (c) cuMemGetInfo reflects the graph reservation.
    assert_eq!(
        out.num("built.free") - out.num("after_a.free"),
        600 * MIB,
        "cuMemGetInfo does not show the graph reservation:{out:?}"
    );
    assert_eq!(
        out.val("launch_b"),
        "2",
        "a second 600m must be refused (OOM):{out:?}"
    );
    assert_eq!(
        out.num("after_b.reserved"),
        600 * MIB,
        "the driver was asked for the over-cap reservation:{out:?}"
    );
    assert_eq!(out.num("after_b.used"), 600 * MIB, "{out:?}");
    assert_eq!(out.num("after_b.free"), out.num("after_a.free"), "{out:?}");
}

/// (b): a captured 600m cuMemAllocAsync launched in a loop is charged once (the reservation is reused); after
/// destroying the exec and trimming, the charge is back.
#[test]
fn captured_allocation_is_charged_once_and_returned() {
    let sim = Sim::new().build();
    let out = run(&sim, "captured");
    assert_eq!(out.val("alloc_async"), "0", "{out:?}");
    assert_eq!(out.val("end_capture"), "0", "{out:?}");
    assert_eq!(out.val("launches_ok"), "10", "{out:?}");
    assert_eq!(out.num("looped.reserved"), 600 * MIB, "{out:?}");
    assert_eq!(
        out.num("built.free") - out.num("looped.free"),
        600 * MIB,
        "the reservation must be charged exactly once:{out:?}"
    );
    assert_eq!(out.val("exec_destroy"), "0", "{out:?}");
    assert_eq!(out.val("trim"), "0", "{out:?}");
    assert_eq!(out.num("trimmed.reserved"), 0, "{out:?}");
    assert_eq!(
        out.num("trimmed.free"),
        out.num("built.free"),
        "trim after destroying must return the charge:{out:?}"
    );
}

/// Without a cap the same programs run unchanged (the shim only accounts).
#[test]
fn uncapped_graph_memory_passes_through() {
    let sim = Sim::new().build();
    let out = sim.cmd_path(probe()).arg("explicit").run();
    assert_eq!(out.val("launch_a"), "0", "{out:?}");
    assert_eq!(out.val("launch_b"), "0", "{out:?}");
    assert_eq!(out.num("after_b.reserved"), 1200 * MIB, "{out:?}");
}

/// A child graph's alloc node (moved into the parent's node) is part of the parent exec's footprint: its
/// 1536 MiB launch is refused under a 1 GiB cap, and the driver's graph pool shows it was not asked. Without a
/// cap the same launch reserves it (the control: the path really takes memory).
#[test]
fn child_graph_alloc_nodes_are_admitted() {
    let sim = Sim::new().build();
    let out = run(&sim, "child");
    out.assert_used_within(GIB);
    assert_eq!(out.val("child_add"), "0", "{out:?}");
    assert_eq!(out.val("instantiate"), "0", "{out:?}");
    assert_eq!(
        out.val("launch"),
        "2",
        "1536m under a 1g cap must be refused:{out:?}"
    );
    assert_eq!(out.num("launched.reserved"), 0, "{out:?}");

    let sim = Sim::new().build();
    let out = sim.cmd_path(probe()).arg("child").run();
    assert_eq!(out.val("launch"), "0", "{out:?}");
    assert_eq!(out.num("launched.reserved"), 1536 * MIB, "{out:?}");
}

/// An exec updated from a graph whose alloc node asks more (`cuGraphExecUpdate`) is admitted for the larger
/// footprint; the same exec not updated (64 MiB) launches.
#[test]
fn an_exec_updated_to_larger_alloc_nodes_is_admitted_for_them() {
    let sim = Sim::new().build();
    let out = run(&sim, "update");
    out.assert_used_within(GIB);
    assert_eq!(out.val("update"), "0", "the simulator takes the update:{out:?}");
    assert_eq!(
        out.val("launch"),
        "2",
        "1536m under a 1g cap must be refused:{out:?}"
    );
    assert_eq!(out.num("launched.reserved"), 0, "{out:?}");

    let sim = Sim::new().build();
    let out = run(&sim, "small");
    assert_eq!(out.val("launch"), "0", "{out:?}");
    assert_eq!(out.num("launched.reserved"), 64 * MIB, "{out:?}");
    assert_eq!(
        out.num("built.free") - out.num("launched.free"),
        64 * MIB,
        "{out:?}"
    );
}
