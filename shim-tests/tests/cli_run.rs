//! `cuquota run`: the program runs under libcuquota.so with the limits set, on the simulated GPU; the exit
//! status is the program's (128+N for a signal); signals sent to `cuquota run` reach the program; orphans stay
//! descendants of `cuquota run` (child subreaper).

use std::time::Duration;

use shim_tests::{cli_bin, program, Cmd, Prog, Sim, GIB, MIB};

/// `cuquota run ARGS…` on this sim (its LD_LIBRARY_PATH, state and usage file), not itself preloaded.
fn run<'a>(sim: &'a Sim, args: &[&str]) -> Cmd<'a> {
    let mut c = sim.cmd_path(cli_bin()).no_preload().arg("run");
    for a in args {
        c = c.arg(a);
    }
    c
}

fn probe() -> String {
    program(Prog::ProbeDirect).display().to_string()
}

#[test]
fn the_program_runs_under_the_cap_and_says_where() {
    let sim = Sim::new().build();
    let out = run(
        &sim,
        &[
            "--memory",
            "1g",
            "--",
            &probe(),
            "init",
            "totalmem",
            "alloc:mem:900m",
            "alloc:mem:200m",
        ],
    )
    .run();
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.num("totalmem"),
        GIB,
        "the program sees the cap as the GPU's size:{out:?}"
    );
    out.expect("alloc.0", "CUDA_SUCCESS")
        .expect("alloc.1", "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(
        out.stderr.contains("running on the simulated GPU"),
        "cuquota run says the GPU is simulated:{out:?}"
    );
    // -q: silent.
    let out = run(&sim, &["-q", "--", &probe(), "init"]).run();
    assert!(out.success() && out.stderr.is_empty(), "{out:?}");
}

#[test]
fn a_memory_request_reaches_the_library_which_shows_the_limit_and_does_not_act_on_it() {
    let sim = Sim::new().build();
    let p = probe();
    let args = |request: &'static str| {
        [
            "--memory",
            "1g",
            "--memory-request",
            request,
            "--",
            p.as_str(),
            "init",
            "totalmem",
            "alloc:mem:900m",
        ]
    };
    let out = run(&sim, &args("512m")).env("CUQUOTA_LOG", "debug").run();
    assert!(out.success(), "{out:?}");
    // The program is shown the limit, and may use it: the request is not acted on yet.
    assert_eq!(out.num("totalmem"), GIB, "{out:?}");
    out.expect("alloc.0", "CUDA_SUCCESS");
    assert!(
        out.stderr.contains("memory_request: Some(536870912)"),
        "the library's policy carries the request:{out:?}"
    );
    // Bad input: a request above the limit is refused before the program runs (exit 125, both figures).
    let out = run(&sim, &args("2g")).run();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        out.stderr.contains("--memory-request 2 GiB") && out.stderr.contains("1 GiB"),
        "{out:?}"
    );
}

#[test]
fn run_sets_up_its_own_simulated_gpu() {
    let sim = Sim::new().build();
    let out = run(
        &sim,
        &[
            "--sim",
            "--sim-memory",
            "8g",
            "--memory",
            "3g",
            "--",
            &probe(),
            "init",
            "simused",
            "totalmem",
        ],
    )
    .env_remove("LD_LIBRARY_PATH")
    .env_remove("CUDASIM_STATE")
    .env_remove("CUDASIM_MEMORY")
    .run();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.num("totalmem"), 3 * GIB, "{out:?}");
    assert!(
        out.stderr
            .contains("as asked: running on the simulated GPU (1 device of 8 GiB"),
        "{out:?}"
    );
    // Without --sim it picks the simulator only when libcuda.so.1 does not load (no NVIDIA driver).
    let out = run(&sim, &["--", &probe(), "init", "totalmem"])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CUDASIM_STATE")
        .run();
    // SAFETY: NUL-terminated name; the handle is closed again.
    let driver = unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY);
        !h.is_null() && libc::dlclose(h) == 0
    };
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.stderr
            .contains("no NVIDIA driver found: running on the simulated GPU"),
        !driver,
        "{out:?}"
    );
}

#[test]
fn exit_status_is_the_programs() {
    let sim = Sim::new().build();
    let code = |args: &[&str]| run(&sim, args).run().status.code();
    assert_eq!(code(&["--", "sh", "-c", "exit 7"]), Some(7));
    assert_eq!(code(&["--", "true"]), Some(0));
    assert_eq!(code(&["--", "sh", "-c", "kill -TERM $$"]), Some(128 + 15));
    assert_eq!(code(&["--", "sh", "-c", "kill -KILL $$"]), Some(128 + 9));
    assert_eq!(code(&["--", "/nonexistent/program"]), Some(127));
    let not_executable = sim.dir().join("data.txt");
    std::fs::write(&not_executable, "not a program").unwrap();
    assert_eq!(code(&["--", not_executable.to_str().unwrap()]), Some(126));
    assert_eq!(code(&["--library", "/nonexistent.so", "--", "true"]), Some(125));
    assert_eq!(code(&["--memory", "12x", "--", "true"]), Some(2), "bad arguments");
    assert_eq!(code(&[]), Some(2), "no program");
}

#[test]
fn environment_limits_only_go_down_and_devices_are_chosen() {
    let sim = Sim::new().devices(2).build();
    let show = "echo preload=$LD_PRELOAD; echo mem=$CUDA_DEVICE_MEMORY_LIMIT; echo sm=$CUDA_DEVICE_SM_LIMIT; \
                echo policy=$CUQUOTA_POLICY; echo visible=$CUDA_VISIBLE_DEVICES; echo usage=$CUQUOTA_USAGE_FILE";
    let out = run(
        &sim,
        &[
            "--memory", "1g", "--sm", "30", "--policy", "hard", "--device", "1", "--", "sh", "-c", show,
        ],
    )
    .env("CUDA_DEVICE_MEMORY_LIMIT", "512m")
    .run();
    assert!(out.success(), "{out:?}");
    assert!(out.val("preload").ends_with("libcuquota.so"), "{out:?}");
    out.expect("mem", "512m") // already lower: kept
        .expect("sm", "30")
        .expect("policy", "hard")
        .expect("visible", "1")
        .expect("usage", sim.usage_file().to_str().unwrap());

    // And the program really gets the lower cap, on the device asked for.
    let out = run(
        &sim,
        &[
            "--memory",
            "1g",
            "--device",
            "1",
            "--",
            &probe(),
            "init",
            "totalmem",
            "uuid",
        ],
    )
    .env("CUDA_DEVICE_MEMORY_LIMIT", "512m")
    .run();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.num("totalmem"), 512 * MIB, "{out:?}");
    let second = run(&sim, &["--", &probe(), "init", "dev:1", "uuid"]).run();
    assert_eq!(
        out.val("uuid"),
        second.val("uuid"),
        "--device 1 is the second GPU"
    );
}

#[test]
fn signals_are_forwarded_to_the_program() {
    let sim = Sim::new().build();
    // `wait` returns as soon as a trapped signal arrives (POSIX), so each trap runs at once, and the shell forks
    // one `sleep` per signal rather than 20 a second (a loaded machine runs this slowly enough as it is).
    // Not HUP: under nohup (as a CI runner may start us) it is ignored on entry, and a shell cannot trap a
    // signal ignored on entry — cuquota run passes dispositions on unchanged, as exec does.
    let script = "trap 'echo got=USR1; kill $!' USR1; trap 'echo got=USR2; kill $!' USR2; \
                  trap 'echo got=TERM; kill $!; exit 3' TERM; \
                  echo ready=1; while :; do sleep 30 >/dev/null 2>&1 & wait $!; done";
    let mut p = run(&sim, &["-q", "--", "sh", "-c", script])
        .timeout(Duration::from_secs(90))
        .spawn();
    p.wait_for("ready");
    let pid = p.pid() as i32;
    // SAFETY: signalling the cuquota process this test started, by pid.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    p.wait_for("got");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGUSR2) };
    p.wait_for_nth("got", 2);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = p.finish();
    assert_eq!(out.all("got"), ["USR1", "USR2", "TERM"], "{out:?}");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the program's own exit status:{out:?}"
    );
}

#[test]
fn orphans_stay_in_the_subtree_of_cuquota_run() {
    let sim = Sim::new().build();
    // The inner sh is orphaned when its parent subshell exits; it then reports its parent.
    let script = "(sh -c 'sleep 0.3; echo orphan_ppid=$(cut -d\" \" -f4 /proc/$$/stat)' &); sleep 1.5";
    let p = run(&sim, &["-q", "--", "sh", "-c", script]).spawn();
    let cuquota = p.pid();
    let out = p.finish();
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.num("orphan_ppid"),
        u64::from(cuquota),
        "an orphan is re-parented to cuquota run, not init:{out:?}"
    );
}

/// The README's command, on a machine as fresh as a test can make it (no simulator on the library path, no
/// simulator or usage variables): the program is told the cap and refused above it.
#[test]
fn the_readme_example_runs_as_written() {
    let readme = std::fs::read_to_string(shim_tests::workspace_root().join("README.md")).unwrap();
    let line = "cargo run --release -p cuquota-cli -- run --memory 1g -- python3 examples/cuda_alloc.py";
    assert!(readme.contains(line), "the README shows `{line}`");
    let sim = Sim::new().build();
    let mut c = sim
        .cmd_path(cli_bin())
        .no_preload()
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CUQUOTA_USAGE_FILE");
    for k in [
        "CUDASIM_STATE",
        "CUDASIM_DEVICES",
        "CUDASIM_MEMORY",
        "CUDASIM_CTX_OVERHEAD",
    ] {
        c = c.env_remove(k);
    }
    let script = shim_tests::workspace_root().join("examples/cuda_alloc.py");
    let out = c
        .args("run --memory 1g -- python3")
        .arg(script.to_str().unwrap())
        .run();
    assert!(out.success(), "{out:?}");
    let text = out.lines.join("\n");
    assert!(text.contains("cuDeviceTotalMem: 1024 MiB"), "{text}");
    assert!(
        text.contains("cuMemGetInfo: 768 MiB free of 1024 MiB"),
        "the 256 MiB context is charged:\n{text}"
    );
    assert!(
        text.contains("allocated 3 x 256 MiB = 768 MiB, then CUDA_ERROR_OUT_OF_MEMORY"),
        "{text}"
    );
}
