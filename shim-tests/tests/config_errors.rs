//! Bad configuration fails closed: cuInit fails, stderr names the variable and its value, and no allocation
//! reaches the driver. Valid spellings (HAMi's syntax) are accepted.

use shim_tests::{Prog, Sim, GIB, MIB};

fn fails_closed(env: &[(&str, &str)], must_name: &[&str]) {
    let sim = Sim::new().build();
    let mut cmd = sim.cmd(Prog::Probe);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let out = cmd.args("simused init dev:0 alloc:mem:64m simused").run();
    assert!(out.success(), "the program must not crash:{out:?}");
    assert_ne!(
        out.val("init"),
        "CUDA_SUCCESS",
        "cuInit must fail with {env:?}:{out:?}"
    );
    assert_ne!(
        out.val("dev.0"),
        "CUDA_SUCCESS",
        "contexts must be refused with {env:?}:{out:?}"
    );
    assert_ne!(
        out.val("alloc.0"),
        "CUDA_SUCCESS",
        "allocation must be refused with {env:?}:{out:?}"
    );
    assert_eq!(
        out.nth_num("sim.used.0", 0),
        out.nth_num("sim.used.0", 1),
        "the driver was reached:{out:?}"
    );
    for s in must_name {
        assert!(out.stderr.contains(s), "stderr must name `{s}`:{out:?}");
    }
}

#[test]
fn memory_limit_with_unknown_suffix() {
    fails_closed(
        &[("CUDA_DEVICE_MEMORY_LIMIT", "12x")],
        &["CUDA_DEVICE_MEMORY_LIMIT", "12x"],
    );
}

#[test]
fn negative_memory_limit() {
    fails_closed(
        &[("CUDA_DEVICE_MEMORY_LIMIT", "-1")],
        &["CUDA_DEVICE_MEMORY_LIMIT", "-1"],
    );
}

#[test]
fn per_device_memory_limit_garbage() {
    fails_closed(
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")],
        &["CUDA_DEVICE_MEMORY_LIMIT_0", "lots"],
    );
}

#[test]
fn sm_limit_not_a_number() {
    fails_closed(
        &[("CUDA_DEVICE_SM_LIMIT", "abc")],
        &["CUDA_DEVICE_SM_LIMIT", "abc"],
    );
}

#[test]
fn conflicting_hami_and_cuquota_names() {
    fails_closed(
        &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), ("CUQUOTA_MEMORY_LIMIT", "2g")],
        &["CUDA_DEVICE_MEMORY_LIMIT", "CUQUOTA_MEMORY_LIMIT"],
    );
}

#[test]
fn unknown_policy() {
    fails_closed(&[("CUQUOTA_POLICY", "fastest")], &["CUQUOTA_POLICY", "fastest"]);
}

/// Positive controls: the same variables with valid values work and set the cap they say.
#[test]
fn valid_spellings_are_accepted() {
    let cases: &[(&[(&str, &str)], u64)] = &[
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "1g")], GIB),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "3000m")], 3000 * MIB),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "0x40000000")], GIB),
        // cuquota's own name takes cuquota's units (HAMi-core reads `2GiB` as 2 bytes: refused under HAMi's name).
        (&[("CUQUOTA_MEMORY_LIMIT", "2GiB")], 2 * GIB),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "1073741824")], GIB),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "512m"),
            ],
            512 * MIB,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), ("CUQUOTA_MEMORY_LIMIT", "1g")],
            GIB,
        ),
        (&[("CUQUOTA_MEMORY_LIMIT", "768m")], 768 * MIB),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_SM_LIMIT", "150"),
            ],
            GIB,
        ),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "0")], 16 * GIB),
    ];
    let sim = Sim::new().memory("16g").build();
    for (env, cap) in cases {
        let mut cmd = sim.cmd(Prog::Probe);
        for (k, v) in env.iter() {
            cmd = cmd.env(k, v);
        }
        let out = cmd.args("init totalmem").run();
        out.ok().expect("init", "CUDA_SUCCESS");
        assert_eq!(out.num("totalmem"), *cap, "{env:?}:{out:?}");
    }
}

/// CUDA_DISABLE_CONTROL=true / CUQUOTA_DISABLE=1: pure pass-through, even with a limit set.
#[test]
fn opt_out_passes_through() {
    let sim = Sim::new().memory("8g").build();
    for (k, v) in [("CUDA_DISABLE_CONTROL", "true"), ("CUQUOTA_DISABLE", "1")] {
        let out = sim
            .cmd(Prog::Probe)
            .mem_limit("1g")
            .env(k, v)
            .args("init totalmem alloc:mem:2g")
            .run();
        out.ok();
        assert_eq!(out.num("totalmem"), 8 * GIB, "{k}={v}:{out:?}");
        out.expect("alloc.0", "CUDA_SUCCESS");
    }
}

/// Every log line names the process that wrote it, at the level set by CUQUOTA_LOG or HAMi's LIBCUDA_LOG_LEVEL.
#[test]
fn log_lines_carry_the_pid_and_level() {
    let sim = Sim::new().build();
    let p = sim
        .cmd(Prog::Probe)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "12x")
        .args("pid init")
        .run();
    let pid = p.val("pid");
    assert!(
        p.stderr.contains(&format!("cuquota[{pid}]: error: ")),
        "the error line must carry the pid:{p:?}"
    );
    // Info lines appear at LIBCUDA_LOG_LEVEL=3 (HAMi-core: 2 is its default, warnings) and CUQUOTA_LOG=info.
    for (var, val, shown) in [
        ("LIBCUDA_LOG_LEVEL", "3", true),
        ("LIBCUDA_LOG_LEVEL", "2", false),
        ("CUQUOTA_LOG", "info", true),
        ("CUQUOTA_LOG", "warn", false),
    ] {
        let p = sim
            .cmd(Prog::Probe)
            .env(var, val)
            .env("CUQUOTA_DISABLE", "1")
            .args("pid init")
            .run();
        let pid = p.val("pid");
        assert_eq!(
            p.stderr.contains(&format!("cuquota[{pid}]: info: ")),
            shown,
            "{var}={val}:{p:?}"
        );
    }
}

/// Class 6 of issue 11: a deployment that declares the agent's limits file required
/// (`CUQUOTA_LIMITS_REQUIRED=1`, or the marker `/etc/cuquota/required`) gets every CUDA call refused, with a
/// clear error, when no limits file can be read — opting out included — and runs normally when one is there.
#[test]
fn a_required_limits_file_that_is_missing_fails_closed() {
    fails_closed(
        &[
            ("CUQUOTA_LIMITS_REQUIRED", "1"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ],
        &["no agent limits file", "CUQUOTA_LIMITS_REQUIRED"],
    );
    fails_closed(
        &[("CUQUOTA_LIMITS_REQUIRED", "1"), ("CUDA_DISABLE_CONTROL", "true")],
        &["no agent limits file"],
    );
}

#[test]
fn a_required_limits_file_that_is_there_is_used() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    let out = sim
        .cmd(Prog::Probe)
        .env("CUQUOTA_LIMITS_REQUIRED", "1")
        .args("init alloc:mem:512m alloc:mem:768m")
        .run();
    out.ok();
    out.expect("init", "CUDA_SUCCESS");
    out.expect("alloc.0", "CUDA_SUCCESS");
    out.expect("alloc.1", "CUDA_ERROR_OUT_OF_MEMORY");
}

/// Class 6 of issue 11: under an agent limits file, opting out is off unless the file allows it
/// (`cuquota limits set … --allow-opt-out`); without any agent file the environment is the only source of limits
/// and the switches work as HAMi's do (`opt_out_passes_through`).
#[test]
fn opting_out_under_an_agent_limits_file_needs_its_permission() {
    let sim = Sim::new().memory("8g").build();
    sim.agent_memory_limit(0, "1g");
    let try_opt_out = || {
        let out = sim
            .cmd(Prog::Probe)
            .env("CUDA_DISABLE_CONTROL", "true")
            .args("init alloc:mem:2g")
            .run();
        out.ok();
        out.val("alloc.0").to_string()
    };
    assert_eq!(
        try_opt_out(),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_DISABLE_CONTROL=true escaped an agent limits file that does not allow opting out"
    );
    let file = sim.limits_file();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "0",
        "--allow-opt-out",
    ]);
    assert!(out.success(), "{out:?}");
    assert_eq!(try_opt_out(), "CUDA_SUCCESS", "the file allows opting out");
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "0",
        "--no-opt-out",
    ]);
    assert!(out.success(), "{out:?}");
    assert_eq!(try_opt_out(), "CUDA_ERROR_OUT_OF_MEMORY", "forbidden again");
}
