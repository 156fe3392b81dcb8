//! Every graph path admits the stack its kernels make the driver grow before the driver grows it, as a direct
//! launch does (`hooks::graph_memory`'s walk, `Memory::first_launch`): launch (+ `_ptsz`), kernel node
//! parameters set before instantiation, exec updates (`cuGraphExecUpdate`, `cuGraphExecKernelNodeSetParams`,
//! `cuGraphExecNodeSetParams`), conditional bodies, child graphs (and a conditional node inside a cloned child),
//! upload (+ `_ptsz`) and the device-side launch it enables. Each attack (a kernel with 16 KiB of local memory a
//! thread, ~4 GiB of stack on the simulator's device, under a 1 GiB cap) must be refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` and leave the simulator's own used bytes within the cap; each control (the same
//! path with a kernel without local memory) succeeds. Before: every attack was let through and measured after,
//! the simulated GPU holding 4386 MiB (`c/graph_stack.c`).

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "graph_stack",
        &workspace_root().join("shim-tests/c/graph_stack.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

fn run(path: &str, kind: &str) -> Output {
    run_with(path, kind, &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")])
}

fn run_with(path: &str, kind: &str, env: &[(&str, &str)]) -> Output {
    run_on(path, kind, env, 1)
}

fn run_devices(path: &str, kind: &str, devices: u32) -> Output {
    run_on(path, kind, &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")], devices)
}

fn run_on(path: &str, kind: &str, env: &[(&str, &str)], devices: u32) -> Output {
    let sim = Sim::new().devices(devices).build();
    let mut c = sim.cmd_path(prog()).args(&format!("{path} {kind} 16384"));
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    println!("{path} {kind}: peak {} MiB: {out:?}", out.peak("used") / MIB);
    out
}

/// The attack on `path`: refused before the driver grew anything, the process within the cap.
#[track_caller]
fn refused(path: &str) {
    let out = run(path, "big");
    assert_eq!(out.get("op"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(GIB);
}

/// The control on `path`: the same graph with a small kernel runs, and the cap is still filled to.
#[track_caller]
fn admitted(path: &str) {
    let out = run(path, "small");
    assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{out:?}");
    assert!(out.num("fill.count") > 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn graph_launch_of_a_big_stack_kernel_is_refused() {
    refused("launch");
    refused("launch_ptsz");
}

#[test]
fn graph_launch_of_a_small_kernel_runs() {
    admitted("launch");
    admitted("launch_ptsz");
}

/// Control: the direct launch's refusal still holds, and its small kernel runs.
#[test]
fn direct_launch_is_refused_as_before() {
    refused("direct");
    admitted("direct");
}

/// `cuGraphKernelNodeSetParams` before instantiation: the walk reads the node's parameters as they are then.
#[test]
fn kernel_node_set_before_instantiation_is_refused() {
    refused("kernel_set");
    admitted("kernel_set");
}

/// An exec launched with a small kernel, then given the big one: its next launch is refused (before: measured
/// after the driver grew the stack).
#[test]
fn exec_updates_to_a_big_stack_kernel_are_refused() {
    for path in ["exec_update", "exec_kernel_set", "exec_node_set"] {
        refused(path);
    }
}

#[test]
fn exec_updates_to_a_small_kernel_run() {
    for path in ["exec_update", "exec_kernel_set", "exec_node_set"] {
        admitted(path);
    }
}

/// A conditional node's body kernels are priced whether or not the body runs this launch (the device decides).
#[test]
fn conditional_bodies_are_refused() {
    refused("conditional");
    refused("conditional_off");
}

#[test]
fn conditional_bodies_with_small_kernels_run() {
    admitted("conditional");
    admitted("conditional_off");
}

/// A child graph node (a clone of the child), and a conditional node inside it (whose clone's bodies no call
/// lists: priced from the original's when cloned).
#[test]
fn child_graphs_are_refused() {
    refused("child");
    refused("child_cond");
}

#[test]
fn child_graphs_with_small_kernels_run() {
    admitted("child");
    admitted("child_cond");
}

/// `cuGraphUpload` of an exec instantiated for device launch sets up its stack (the device launches it where no
/// hook sees it): refused there.
#[test]
fn upload_of_a_device_launch_graph_is_refused() {
    refused("upload");
    refused("upload_ptsz");
}

#[test]
fn upload_of_a_small_device_launch_graph_runs() {
    admitted("upload");
    admitted("upload_ptsz");
}

/// `cuGraphInstantiateWithParams` with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` uploads inside the instantiation:
/// refused there (the exec not made), the program's flags as it set them.
#[test]
fn instantiate_with_upload_is_refused() {
    let out = run("instantiate_upload", "big");
    assert_eq!(out.get("op"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    assert_eq!(out.get("flags.kept"), Some("1"), "{out:?}");
    assert_eq!(
        out.get("result_out"),
        Some("1"),
        "CUDA_GRAPH_INSTANTIATE_ERROR:{out:?}"
    );
    out.assert_used_within(GIB);
}

#[test]
fn instantiate_with_upload_of_a_small_graph_runs() {
    admitted("instantiate_upload");
    let out = run("instantiate_upload", "small");
    assert_eq!(out.get("flags.kept"), Some("1"), "{out:?}");
    assert_eq!(out.get("result_out"), Some("0"), "{out:?}");
}

/// A device-side launch of an exec whose upload was refused runs nothing (cuda.h: not uploaded); the host graph
/// that launches it runs, within the cap. The control's upload and launch both succeed.
#[test]
fn device_launch_after_a_refused_upload_stays_within_the_cap() {
    let out = run("device", "big");
    assert_eq!(out.get("upload"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{out:?}");
    out.assert_used_within(GIB);
    let out = run("device", "small");
    assert_eq!(out.get("upload"), Some("CUDA_SUCCESS"), "{out:?}");
    admitted("device");
}

/// A graph whose kernels cannot all be listed under a cap is refused at instantiation (fail closed,
/// `CUDA_ERROR_NOT_SUPPORTED`): a conditional node made past cuquota (libcuda's own `cuGraphAddNode_v2`: its
/// bodies no call lists), and a kernel node whose parameters the driver refuses to give
/// (`cuGraphKernelNodeGetParams_v2` failing). Control: without a cap the same graphs instantiate and run.
#[test]
fn a_graph_whose_kernels_cannot_be_listed_is_refused_under_a_cap() {
    const FAULT: (&str, &str) = ("CUDASIM_FAULT", "cuGraphKernelNodeGetParams_v2:1+:UNKNOWN");
    let hidden = run("hidden_cond", "big");
    let faulted = run_with("launch", "big", &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), FAULT]);
    for out in [&hidden, &faulted] {
        assert_eq!(
            out.get("instantiate"),
            Some("CUDA_ERROR_NOT_SUPPORTED"),
            "{out:?}"
        );
        out.assert_used_within(GIB);
    }
    for out in [
        run_with("hidden_cond", "small", &[]),
        run_with("launch", "small", &[FAULT]),
    ] {
        assert_eq!(out.get("instantiate"), None, "{out:?}");
        assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{out:?}");
    }
}

/// A clone's record (what its original needed when cloned) covers only the conditional nodes the clone came
/// with: a conditional node made past cuquota inside a child graph node's own graph after the clone (its
/// bodies unlisted) is refused under a cap as in any other graph. Before: the clone's record made every unknown
/// conditional node in that graph known, and the big body's stack was let through (the simulator holding
/// 4190 MiB under a 1 GiB cap). Control: without a cap the same graph instantiates and runs.
#[test]
fn a_hidden_conditional_added_to_a_clone_is_refused_under_a_cap() {
    let out = run("hidden_in_clone", "big");
    assert_eq!(
        out.get("instantiate"),
        Some("CUDA_ERROR_NOT_SUPPORTED"),
        "{out:?}"
    );
    out.assert_used_within(GIB);
    let out = run_with("hidden_in_clone", "small", &[]);
    assert_eq!(out.get("instantiate"), None, "{out:?}");
    assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{out:?}");
}

/// A node whose type the driver refuses to give (`cuGraphNodeGetType` failing) may be a kernel node: under a
/// cap the graph is refused at instantiation as one whose kernels cannot be listed. Before: the node was
/// skipped and its kernel's stack let through (the simulator holding 3962 MiB under a 1 GiB cap). Control:
/// without a cap the same graph instantiates and runs.
#[test]
fn a_graph_whose_node_types_cannot_be_read_is_refused_under_a_cap() {
    const FAULT: (&str, &str) = ("CUDASIM_FAULT", "cuGraphNodeGetType:1+:UNKNOWN");
    let out = run_with("launch", "big", &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), FAULT]);
    assert_eq!(
        out.get("instantiate"),
        Some("CUDA_ERROR_NOT_SUPPORTED"),
        "{out:?}"
    );
    out.assert_used_within(GIB);
    let out = run_with("launch", "small", &[FAULT]);
    assert_eq!(out.get("instantiate"), None, "{out:?}");
    assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{out:?}");
}

/// The same exec updates made while no context is current, in a process that sees two devices (the library
/// asks the driver which device is current, and none is): the new kernel's stack is still admitted at the
/// exec's next launch. Before: the update's kernels were read as needing no stack, the exec's need replaced by
/// 0, and its next launch let the big kernel's stack through (the simulator holding 3962 MiB under a 1 GiB cap).
#[test]
fn exec_updates_without_a_current_context_are_refused() {
    for path in [
        "exec_update_noctx",
        "exec_kernel_set_noctx",
        "exec_node_set_noctx",
    ] {
        let out = run_devices(path, "big", 2);
        assert_eq!(out.get("update"), Some("CUDA_SUCCESS"), "{out:?}");
        assert_eq!(out.get("op"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{path}: {out:?}");
        out.assert_used_within(GIB);
        let out = run_devices(path, "small", 2);
        assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{path}: {out:?}");
        assert!(out.num("fill.count") > 0, "{out:?}");
        out.assert_used_within(GIB);
    }
}

/// A context whose stack size the driver will not tell (`cuCtxGetLimit` failing) is taken to have none: the
/// whole stack a kernel needs is admitted, by a graph's launch as by a direct one. Before: the growth was
/// taken as 0 and let through (the simulator holding 3962 MiB under a 1 GiB cap on both paths). Control:
/// the small kernels run under the same fault.
#[test]
fn an_unknown_stack_size_is_taken_as_none() {
    const FAULT: (&str, &str) = ("CUDASIM_FAULT", "cuCtxGetLimit:1+:UNKNOWN");
    for path in ["launch", "direct", "upload"] {
        let out = run_with(path, "big", &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), FAULT]);
        assert_eq!(out.get("op"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{path}: {out:?}");
        out.assert_used_within(GIB);
        let out = run_with(path, "small", &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), FAULT]);
        assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{path}: {out:?}");
        out.assert_used_within(GIB);
    }
}

/// A kernel whose local memory size the driver will not give (`cuFuncGetAttribute` failing, not for a bad
/// handle) is refused under a cap: a direct launch with `CUDA_ERROR_OUT_OF_MEMORY`, a graph holding it at
/// instantiation (`CUDA_ERROR_NOT_SUPPORTED`), as one whose kernels cannot be listed. Before: its need was
/// taken as 0 and the stack let through (3962 MiB under a 1 GiB cap by each path, upload too). Control: without a cap the
/// same program runs.
#[test]
fn a_kernel_whose_local_size_is_unknown_is_refused_under_a_cap() {
    const FAULT: (&str, &str) = ("CUDASIM_FAULT", "cuFuncGetAttribute:1+:UNKNOWN");
    for path in ["launch", "direct"] {
        let out = run_with(path, "big", &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), FAULT]);
        let want = if path == "direct" {
            ("op", "CUDA_ERROR_OUT_OF_MEMORY")
        } else {
            ("instantiate", "CUDA_ERROR_NOT_SUPPORTED")
        };
        assert_eq!(out.get(want.0), Some(want.1), "{path}: {out:?}");
        out.assert_used_within(GIB);
        let out = run_with(path, "small", &[FAULT]);
        assert_eq!(out.get("op"), Some("CUDA_SUCCESS"), "{path}: {out:?}");
    }
}
