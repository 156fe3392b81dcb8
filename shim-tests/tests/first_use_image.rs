//! What a first use takes is admitted before the driver takes it, from the module's or library's image
//! (`src/memory/image.rs`), and stays charged without NVML (issue 35, item 2). Judged by the simulator's own used
//! bytes (`c/first_use_image.c`). Each attack beside its control; NVML absent, broken and erroring.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "first_use_image",
        &workspace_root().join("shim-tests/c/first_use_image.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

fn run(sim: &Sim, args: &str, env: &[(&str, &str)]) -> Output {
    let mut c = sim
        .cmd_path(prog())
        .args(args)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    println!("{args} {env:?}: peak {} MiB", out.peak("used") / MIB);
    out
}

/// One `__device__` global of 3 GiB under a 1 GiB cap, in each image format the driver loads lazily: its first
/// use is refused before the driver takes it (before: measured after, 3 GiB + the context held), and nothing
/// else passes the cap after. `cubin_liar`: the symbol declares 3 GiB in a 4-byte section (the simulator
/// allocates the symbol's size).
#[test]
fn a_first_use_larger_than_the_cap_is_refused_before_the_driver_takes_it() {
    for mode in ["cubin_mod", "cubin_lib", "cubin_liar", "ptx_mod"] {
        let sim = Sim::new().build();
        let out = run(&sim, &format!("{mode} 3g 1"), &[]);
        assert_eq!(
            out.get("global.0"),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{mode}:{out:?}"
        );
        out.assert_used_within(GIB);
    }
}

/// CONTROL: a 256 MiB global fits: admitted, and the program fills up to the cap after it.
#[test]
fn a_first_use_that_fits_is_admitted() {
    let sim = Sim::new().build();
    let out = run(&sim, "cubin_mod 256m 1", &[]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    assert!(out.num("fill.count") > 0, "{out:?}");
    out.assert_used_within(GIB);
}

/// The ways NVML can be missing: named away (the tenant's `CUQUOTA_LIBNVML`), an empty `libnvidia-ml.so.1` first
/// on `LD_LIBRARY_PATH`, and the process list failing (every call, or every other one).
fn without_nvml(sim: &Sim) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let empty = sim.dir().join("empty-nvml");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("libnvidia-ml.so.1"), b"").unwrap();
    let path = format!("{}:{}", empty.display(), sim.lib_dir().display());
    vec![
        (
            "absent",
            vec![("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1".into())],
        ),
        ("broken", vec![("LD_LIBRARY_PATH", path)]),
        (
            "erroring",
            vec![(
                "CUDASIM_FAULT",
                "nvmlDeviceGetComputeRunningProcesses_v3:1+:UNKNOWN".into(),
            )],
        ),
        (
            "transient",
            vec![(
                "CUDASIM_FAULT",
                "nvmlDeviceGetComputeRunningProcesses_v3:random(0.5):UNKNOWN".into(),
            )],
        ),
    ]
}

/// Eight modules with a 512 MiB global each, looked up, NVML missing each way: each first use is charged its
/// image's footprint (before: nothing without NVML, 4 GiB and a fill on top under the 1 GiB cap).
#[test]
fn without_nvml_first_uses_are_charged_their_images_footprint() {
    for mode in ["cubin_mod", "cubin_lib"] {
        let sim = Sim::new().build();
        for (how, env) in without_nvml(&sim) {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let out = run(&sim, &format!("{mode} 512m 8"), &env);
            assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{mode} {how}:{out:?}");
            let p = out.peak("used");
            assert!(
                p <= GIB,
                "{mode} {how}: {} MiB under the 1 GiB cap:{out:?}",
                p / MIB
            );
        }
    }
}

/// NVML present, and named away (`CUQUOTA_LIBNVML`).
fn nvml_present_and_absent() -> [(&'static str, Vec<(&'static str, &'static str)>); 2] {
    [
        ("present", vec![]),
        (
            "absent",
            vec![("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1")],
        ),
    ]
}

/// A fat binary whose one entry, compressed (an LZ4 block, a Zstandard frame: nvcc 13's default mode), is a
/// cubin with a 3 GiB `__device__` global, under a 1 GiB cap, NVML present and absent: the entry is decompressed
/// at load and the global's first use refused before the driver takes it (before: an image the library could not
/// read, measured after the driver took it: 3 GiB and the context held).
#[test]
fn a_compressed_fat_binarys_first_use_larger_than_the_cap_is_refused() {
    for mode in ["fatbin_lz4", "fatbin_zstd"] {
        for (how, env) in nvml_present_and_absent() {
            let sim = Sim::new().build();
            let out = run(&sim, &format!("{mode} 3g 1"), &env);
            assert_eq!(
                out.get("global.0"),
                Some("CUDA_ERROR_OUT_OF_MEMORY"),
                "{mode} {how}:{out:?}"
            );
            out.assert_used_within(GIB);
        }
    }
}

/// CONTROL: the simulator reads those fat binaries as the driver does: a 256 MiB global of each is looked up
/// (the simulator decompresses the entry and allocates it), and the program fills up to the cap after it.
#[test]
fn a_compressed_fat_binarys_first_use_that_fits_is_admitted() {
    for mode in ["fatbin_lz4", "fatbin_zstd"] {
        let sim = Sim::new().build();
        let out = run(&sim, &format!("{mode} 256m 1"), &[]);
        assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{mode}:{out:?}");
        assert!(
            out.peak("used") >= 256 * MIB,
            "{mode}: the global was not allocated:{out:?}"
        );
        assert!(out.num("fill.count") > 0, "{mode}:{out:?}");
        out.assert_used_within(GIB);
    }
}

/// A graph whose one kernel node runs a library's kernel, the library's cubin holding a 3 GiB global, NVML
/// absent, under a 1 GiB cap: the graph's first launch loads the library into the context (its code and
/// globals), so the kernel's code load is admitted before it from the image, as a direct first launch's is, and
/// the launch refused (before: only the stack admitted, the load neither admitted nor, without NVML, charged).
#[test]
fn a_graphs_first_launch_admits_its_kernels_code_load_without_nvml() {
    let sim = Sim::new().build();
    let out = run(&sim, "graph_lib 3g 1", &nvml_present_and_absent()[1].1);
    assert_eq!(out.get("global.0"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(GIB);
}

/// CONTROL: the same graph with a 256 MiB global launches and runs, and the program fills up to the cap after it.
#[test]
fn a_graphs_first_launch_whose_code_fits_runs() {
    let sim = Sim::new().build();
    let out = run(&sim, "graph_lib 256m 1", &nvml_present_and_absent()[1].1);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    assert!(
        out.peak("used") >= 256 * MIB,
        "the library's global was not allocated:{out:?}"
    );
    assert!(out.num("fill.count") > 0, "{out:?}");
    out.assert_used_within(GIB);
}

/// An image the library cannot read (the simulator's text format; for a real driver a compressed fat binary),
/// NVML missing: the first use is measured by the driver's free memory across it, so the next is refused: one
/// load past the cap at most, as docs/threat-model.md says (before: never charged, 4 GiB and a fill on top).
#[test]
fn without_nvml_an_unreadable_images_first_use_is_measured_by_free_memory() {
    let sim = Sim::new().build();
    for (how, env) in without_nvml(&sim) {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = run(&sim, "text_lib 512m 8", &env);
        assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{how}:{out:?}");
        let p = out.peak("used");
        assert!(
            p <= GIB + 512 * MIB,
            "{how}: {} MiB, more than one load past the cap:{out:?}",
            p / MIB
        );
        assert_eq!(out.num("fill.count"), 0, "{how}: admitted past the cap:{out:?}");
    }
}

/// Under the operator's limits file the tenant's `CUQUOTA_LIBNVML` is ignored: NVML is the loader's, so 600 MiB
/// taken past the shim is reconciled near the cap with NVML's figure, as in the control without the variable
/// (one bypass past the margin at most, reconcile.rs); before, the variable took NVML away (`cannot load`) and
/// only the ledger decided.
#[test]
fn under_the_operators_limits_the_tenant_cannot_name_nvml() {
    let sim = Sim::new().build();
    let reconcile = compile_c(
        "reconcile",
        &workspace_root().join("shim-tests/c/reconcile.c"),
        &[],
        &["-lcuda", "-ldl"],
    );
    let limits = sim.limits_file();
    sim.agent_limits(&limits, |r| r.memory_limit = GIB);
    let control = sim
        .cmd_path(reconcile.clone())
        .args("bypass 600m 64m")
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .run();
    println!("control: peak {} MiB {control:?}", control.peak("used") / MIB);
    let out = sim
        .cmd_path(reconcile.clone())
        .args("bypass 600m 64m")
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .env("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1")
        .env("CUQUOTA_LOG", "debug")
        .run();
    assert!(out.success(), "{out:?}");
    println!("limits file: peak {} MiB", out.peak("used") / MIB);
    // Near the cap NVML's figure charges the bypass: past the cap by at most what exceeds the margin (256 MiB).
    let bound = GIB + 600 * MIB - 256 * MIB;
    control.assert_used_within(bound);
    out.assert_used_within(bound);
    assert!(out.stderr.contains("ignored"), "said:{out:?}");
    assert!(
        out.stderr.contains("reconciled near the cap: driver says") && !out.stderr.contains("cannot load"),
        "NVML's figure was not used:{out:?}"
    );
}

/// A first launch blocked in the driver on the program's own progress (its stream waits for a flag and is
/// full) holds nothing another thread needs: that thread's own first use (`cuModuleGetFunction`) goes through
/// and it writes the flag, so the program finishes (before: the launch held the process's first-use gate across
/// the driver call, the lookup waited behind it and nothing wrote the flag: a deadlock).
#[test]
fn a_first_launch_blocked_on_the_program_holds_nothing_another_thread_needs() {
    let prog = compile_c(
        "first_use_wait",
        &workspace_root().join("shim-tests/c/first_use_wait.c"),
        &[],
        &["-lcuda", "-ldl", "-lpthread"],
    );
    for mode in ["nowait", "wait"] {
        let sim = Sim::new().build();
        let out = sim
            .cmd_path(prog.clone())
            .args(mode)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .timeout(std::time::Duration::from_secs(60))
            .run();
        println!("{mode}: {out:?}");
        assert!(out.success(), "{mode}: did not finish (deadlock):{out:?}");
        assert_eq!(out.get("done"), Some("1"), "{mode}:{out:?}");
        assert_eq!(out.get("lookup"), Some("CUDA_SUCCESS"), "{mode}:{out:?}");
        assert_eq!(out.get("launch"), Some("CUDA_SUCCESS"), "{mode}:{out:?}");
    }
}
