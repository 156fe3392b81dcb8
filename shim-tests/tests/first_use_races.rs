//! First uses that race, and first launches onto other contexts' streams, judged by the simulator's own used
//! bytes (`c/first_use_races.c`): a 1 GiB cap, one library whose kernel has a G-byte global that the driver
//! loads into each context at the kernel's first launch there. Found by a hostile review of the stream-context
//! fix (`first_use_streams.rs`); each attack beside its control.

use shim_tests::{compile_c, workspace_root, Output, Sim, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "first_use_races",
        &workspace_root().join("shim-tests/c/first_use_races.c"),
        &[],
        &["-lcuda", "-ldl", "-lpthread"],
    )
}

fn run_on(devices: u32, args: &str, env: &[(&str, &str)]) -> Output {
    let sim = Sim::new().devices(devices).build();
    let mut c = sim
        .cmd_path(prog())
        .args(args)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    out
}

fn run(args: &str) -> Output {
    run_on(1, args, &[])
}

const SM10: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "10")];

/// Six threads in six contexts launch the kernel (1200 MiB global) at once, each held by the SM throttle after
/// its admission: one first use at a time in a process (the gate from admission to measurement), so one load
/// passes and the rest are refused, as when they launch one after another (before: each admitted while the
/// container was under its cap, 2406–3608 MiB in about half the rounds).
#[test]
fn concurrent_first_launches_are_admitted_one_at_a_time() {
    let control = run("seq 6 1200m");
    let c = control.peak("used.0");
    println!("control (one after another): peak {} MiB", c / MIB);
    assert!(c <= 1300 * MIB, "control:{control:?}");
    // Four rounds: the old code passed the cap in about half of them.
    for _ in 0..4 {
        let a = run_on(1, "parthr 6 1200m", SM10);
        let p = a.peak("used.0");
        println!("6 threads at once: peak {} MiB", p / MIB);
        assert!(
            p <= 1300 * MIB,
            "concurrent first launches: {} MiB under a 1 GiB cap:{a:?}",
            p / MIB
        );
    }
}

/// A launch seen before is held by the SM throttle; meanwhile another thread resets the primary context, which
/// frees the library's 700 MiB global: the launch then loads it again. Measured after the launch since the seen
/// set forgot something while it ran (control: the reset before the launch; before: never measured, the fill
/// went on, 1470 MiB).
#[test]
fn a_launch_during_which_the_context_was_reset_is_measured() {
    let control = run_on(1, "unloadseq 1 700m", SM10);
    let c = control.peak("used.0");
    println!("control: peak {} MiB", c / MIB);
    assert!(c <= 1100 * MIB, "control:{control:?}");
    let a = run_on(1, "unloadrace 1 700m", SM10);
    let p = a.peak("used.0");
    println!("reset during the throttle's wait: peak {} MiB", p / MIB);
    assert!(p <= 1100 * MIB, "{} MiB under a 1 GiB cap:{a:?}", p / MIB);
}

/// `cuLaunchCooperativeKernelMultiDevice` with six entries on one device's six contexts: each entry's first
/// use would be admitted before the one call loads them all (3084 MiB before); the driver takes one entry per
/// device, so two first uses on one device are refused (`CUDA_ERROR_INVALID_DEVICE`).
#[test]
fn a_multi_device_launch_with_two_entries_on_one_device_is_refused() {
    let a = run("multi 6 512m");
    let p = a.peak("used.0");
    println!("multi: peak {} MiB, {:?}", p / MIB, a.all("launch.0"));
    // Each entry's kernel is loaded into its context first (admitted, measured): the second load is refused
    // for memory, else the two first uses on one device for the device.
    let refused = a.all("launch.0");
    assert!(
        refused == ["CUDA_ERROR_INVALID_DEVICE"] || refused == ["CUDA_ERROR_OUT_OF_MEMORY"],
        "{a:?}"
    );
    assert!(p <= 1100 * MIB, "{} MiB under a 1 GiB cap:{a:?}", p / MIB);
}

/// `cuLaunchKernelEx` with `config->hStream` in other contexts, the primary current: as the control (one load
/// past the cap, then refused).
#[test]
fn launch_ex_onto_other_contexts_streams_is_admitted_there() {
    let a = run("ex 6 512m");
    let p = a.peak("used.0");
    println!("ex: peak {} MiB", p / MIB);
    assert!(p <= 1100 * MIB, "{} MiB under a 1 GiB cap:{a:?}", p / MIB);
}

/// A graph exec launched onto device 1's stream with device 0 current: admitted and measured on device 1.
#[test]
fn a_graph_launched_onto_another_devices_stream_is_measured_there() {
    let a = run_on(2, "gdev1 4 1g", &[]);
    let p = a.peak("used.1");
    println!("graph onto device 1: peak {} MiB on device 1", p / MIB);
    assert!(p <= 1100 * MIB, "{} MiB under device 1's cap:{a:?}", p / MIB);
}

/// A first launch onto another context's stream makes that context current for its queries only: the
/// program's current context is the same after it.
#[test]
fn a_first_launch_onto_another_contexts_stream_leaves_the_current_context() {
    let a = run("ctxcheck 2 16m");
    assert_eq!(a.all("cur.same"), vec!["1"], "{a:?}");
}

/// A lookup in a module from `cuLibraryGetModule` (no load hook saw it; its device is recorded then) on device
/// 1 while device 0 is over its cap: admitted on device 1, as a lookup in a module the program loaded (before
/// that was recorded: refused for device 0's state).
#[test]
fn a_lookup_in_a_library_module_is_admitted_on_its_device() {
    let known = run_on(2, "knownmod 0 1200m", &[]);
    assert_eq!(known.all("lookup"), vec!["CUDA_SUCCESS"], "{known:?}");
    let a = run_on(2, "unknown 0 1200m", &[]);
    assert_eq!(a.all("lookup"), vec!["CUDA_SUCCESS"], "{a:?}");
}

/// Four 700 MiB globals in one module, each taken by the driver at its first `cuModuleGetGlobal`: in a module
/// from `cuLibraryGetModule` as in one from `cuModuleLoadData` (control), never past the cap (a review found the
/// library's module's lookups never refused: 2802 MiB under 1 GiB). The image's footprint (2.8 GiB) is
/// reserved at each first use, so the library's load into the context and the module's lookups are refused
/// before the driver takes anything.
#[test]
fn lookups_in_a_library_module_are_refused_over_the_cap() {
    let prog = compile_c(
        "first_use_modules",
        &workspace_root().join("shim-tests/c/first_use_modules.c"),
        &[],
        &["-lcuda", "-ldl"],
    );
    for mode in ["mod", "lib"] {
        let sim = Sim::new().build();
        let out = sim
            .cmd_path(prog.clone())
            .args(&format!("{mode} 4"))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .run();
        assert!(out.success(), "{out:?}");
        let p = out.peak("used.0");
        println!("{mode}: peak {} MiB", p / MIB);
        assert!(
            p <= 1500 * MIB,
            "{mode}: {} MiB under a 1 GiB cap:{out:?}",
            p / MIB
        );
    }
}

/// A graph with a kernel node (a 500 MiB lazily loaded global) and a 450 MiB alloc node, first launched while
/// the SM throttle holds it and another thread frees a live graph allocation, so the driver backs the new one
/// from the pool and takes nothing for it: the first launch is measured after the graph's memory is settled,
/// not while its 450 MiB provisional charge reads as the driver's (control: the free before the launch; before:
/// the load under-counted, 1210 MiB against 1018 MiB).
#[test]
fn a_graphs_first_launch_is_measured_after_its_memory_nodes_settle() {
    let prog = compile_c(
        "first_use_graph_memory",
        &workspace_root().join("shim-tests/c/first_use_graph_memory.c"),
        &[],
        &["-lcuda", "-ldl", "-lpthread"],
    );
    let run = |mode: &str| {
        let sim = Sim::new().build();
        let out = sim
            .cmd_path(prog.clone())
            .args(&format!("{mode} 450 500"))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .env("CUDA_DEVICE_SM_LIMIT", "10")
            .run();
        assert!(out.success(), "{out:?}");
        out.peak("used.0")
    };
    let (control, attack) = (run("seq"), run("race"));
    println!("control {} MiB, attack {} MiB", control / MIB, attack / MIB);
    assert!(
        attack <= control + 64 * MIB,
        "the free during the wait let {} MiB in, the control {} MiB",
        attack / MIB,
        control / MIB
    );
}
