//! End-to-end tests of the `cuquota` binary against real region files.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use cuquota_core::region::{DeviceSelector, LimitsReader, UsageRegion};
use shim_tests::check_schema;

fn tmp(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cuquota-cli-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn cuquota(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuquota"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn limits_init_set_show_clear() {
    let f = tmp("limits");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let mut reader = LimitsReader::open(&f).unwrap();

    let o = cuquota(&[
        "limits", "set", fs, "--device", "1", "--memory", "3000m", "--sm", "30", "--policy", "hard",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(reader.needs_refresh(), "a live reader sees the change");
    reader.refresh();
    let l = reader.snapshot().for_device(None, Some(1));
    assert_eq!(l.memory, Some(3000 << 20));
    assert_eq!(l.sm, Some(30));
    assert_eq!(l.kind, cuquota_core::PolicyKind::Hard);

    // unspecified fields keep their values
    assert!(cuquota(&[
        "limits",
        "set",
        fs,
        "--device=1",
        "--weight",
        "7",
        "--reserve",
        "2g"
    ])
    .status
    .success());
    reader.refresh();
    let e = *reader.snapshot().get(DeviceSelector::Index(1)).unwrap();
    assert_eq!((e.memory_limit, e.weight), (3000 << 20, 7));

    let o = cuquota(&["limits", "show", fs, "--json"]);
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    let e = &v["entries"][0];
    assert_eq!(e["device"], "1", "{v}");
    assert_eq!(e["index"], 1, "{v}");
    assert_eq!(e["memory_limit_bytes"], 3145728000u64, "{v}");
    assert_eq!(
        (e["sm_limit_percent"].as_u64(), e["weight"].as_u64()),
        (Some(30), Some(7)),
        "{v}"
    );
    assert_eq!(e["policy"], "hard", "{v}");
    assert_eq!(e["reserved_memory_bytes"], 2u64 << 30, "{v}");

    assert!(cuquota(&["limits", "clear", fs, "--device", "1"])
        .status
        .success());
    reader.refresh();
    assert_eq!(reader.snapshot().for_device(None, Some(1)).memory, None);
    let _ = std::fs::remove_file(&f);
}

#[test]
fn limits_members_publish_show_clear() {
    let f = tmp("members");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let o = cuquota(&["limits", "members", fs, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert!(v["members"].is_null(), "no agent membership yet: {v}");

    let o = cuquota(&["limits", "members", fs, "--set", "300,100,200,100", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert_eq!(v["members"], serde_json::json!([100, 200, 300]), "{v}");
    let r = LimitsReader::open(&f).unwrap();
    assert_eq!(r.snapshot().members(), Some(&[100, 200, 300][..]));
    let o = cuquota(&["limits", "show", fs]);
    assert!(text(&o).contains("members: 3 (100, 200, 300)"), "{}", text(&o));

    let o = cuquota(&["limits", "members", fs, "--set", ""]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("members: published, none"), "{}", text(&o));

    for bad in ["12,x", "0", "1,-2"] {
        let o = cuquota(&["limits", "members", fs, "--set", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        assert!(text(&o).contains("is not a pid"), "{bad}: {}", text(&o));
    }
    let many: Vec<String> = (1..=1025).map(|p| p.to_string()).collect();
    let o = cuquota(&["limits", "members", fs, "--set", &many.join(",")]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("1025 member pids"), "{}", text(&o));

    let o = cuquota(&["limits", "members", fs, "--clear"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("not published by the agent"), "{}", text(&o));
    let o = cuquota(&["limits", "members", fs, "--set", "1", "--clear"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn errors_exit_2_with_a_message() {
    let f = tmp("errors");
    let fs = f.to_str().unwrap();
    let o = cuquota(&["limits", "set", fs, "--device", "0", "--memory", "4g"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("open failed"), "{}", text(&o));
    assert!(cuquota(&["limits", "init", fs]).status.success());
    for bad in [
        vec!["limits", "set", fs, "--device", "0", "--memory", "12x"],
        vec!["limits", "set", fs, "--device", "0", "--sm", "150"],
        vec!["limits", "set", fs, "--device", "GPU-12", "--sm", "10"],
        vec!["limits", "set", fs, "--device", "0"],
        vec!["limits", "set", fs, "--device", "0", "--memroy", "1g"],
        vec!["limits", "show"],
        vec!["frobnicate"],
    ] {
        let o = cuquota(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.starts_with("cuquota: "), "{bad:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{bad:?}: one line, not {err}");
        assert!(o.stdout.is_empty(), "{bad:?}");
    }
    // The line names what was wrong.
    for (bad, names) in [
        (
            vec!["limits", "set", fs, "--device", "0", "--memory", "12x"],
            "12x",
        ),
        (
            vec!["limits", "set", fs, "--device", "0", "--memroy", "1g"],
            "--memroy",
        ),
        (vec!["limits", "set", fs, "--device", "0", "--sm", "150"], "150"),
        (
            vec!["limits", "set", fs, "--device", "GPU-12", "--sm", "10"],
            "GPU-12",
        ),
        (vec!["frobnicate"], "frobnicate"),
        (vec!["status", "--interval", "soon"], "soon"),
    ] {
        let err = String::from_utf8_lossy(&cuquota(&bad).stderr).into_owned();
        assert!(err.contains(names), "{bad:?}: {err}");
    }
    let _ = std::fs::remove_file(&f);
}

#[test]
fn status_shows_usage_processes_and_share() {
    let f = tmp("usage");
    let r = UsageRegion::open(&f).unwrap();
    let slot = r.process_slot().unwrap();
    let dev = r.device(&[7; 16]).unwrap();
    r.report_limits(
        dev,
        &cuquota_core::Policy {
            memory: Some(4 << 30),
            sm: Some(30),
            ..cuquota_core::Policy::NONE
        },
    );
    r.try_charge(slot, dev, 3 << 29, Some(4 << 30)).unwrap();
    // A dead process's slot, to be reclaimed by status.
    let ghost = r.claim_slot_as(i32::MAX as u32 - 3, 1).unwrap();
    r.try_charge(ghost, dev, 1 << 30, None).unwrap();

    // Simulate the throttle accounting GPU time while status samples: ~25% busy. The bumper catches up on every
    // wake-up, so a late one shifts the share only by its lag at the window's ends; 1 s windows keep that to a
    // few points on a busy machine.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bumper = {
        let path = f.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let r = UsageRegion::open(&path).unwrap();
            let t = std::time::Instant::now();
            let mut last = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let now = t.elapsed().as_nanos() as u64 / 4;
                r.busy_ns(dev).fetch_add(now - last, Ordering::Relaxed);
                r.gpu_ns(slot, dev).fetch_add(now - last, Ordering::Relaxed);
                last = now;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let o = cuquota(&["status", "--usage", f.to_str().unwrap(), "--interval", "1000"]);
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    assert!(s.contains("1 dead slot(s) reclaimed"), "{s}");
    assert!(
        s.contains("4 GiB") && s.contains("1536 MiB") && s.contains("30%"),
        "{s}"
    );
    assert!(s.contains(&format!("pid {}", std::process::id())), "{s}");

    let o = cuquota(&[
        "status",
        "--usage",
        f.to_str().unwrap(),
        "--json",
        "--interval",
        "1000",
    ]);
    stop.store(true, Ordering::Relaxed);
    bumper.join().unwrap();
    let v = check_schema("status.v1.json", &String::from_utf8(o.stdout).unwrap());
    let d = &v["devices"][0];
    let share = d["share_percent"].as_f64().unwrap();
    assert!((15.0..35.0).contains(&share), "achieved share {share} from {v}");
    assert_eq!(d["memory_used_bytes"], 1610612736u64, "{v}");
    assert_eq!(d["memory_limit_bytes"], 4u64 << 30, "{v}");
    assert_eq!(d["sm_limit_percent"], 30, "{v}");
    assert_eq!(d["uuid"], "GPU-07070707-0707-0707-0707-070707070707", "{v}");
    assert_eq!(d["processes"][0]["pid"], std::process::id(), "{v}");
    let _ = std::fs::remove_file(&f);
}

#[test]
fn read_only_commands_do_not_change_an_empty_file() {
    let f = tmp("empty");
    std::fs::write(&f, b"").unwrap();
    for args in [
        &["status", "--usage", f.to_str().unwrap()][..],
        &["limits", "show", f.to_str().unwrap()][..],
    ] {
        let o = cuquota(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("not initialised") || text(&o).contains("not initialized"),
            "{}",
            text(&o)
        );
        assert_eq!(
            std::fs::metadata(&f).unwrap().len(),
            0,
            "{args:?} changed the file"
        );
    }
    let _ = std::fs::remove_file(&f);
}

#[test]
fn non_utf8_paths_work_and_other_non_utf8_arguments_are_errors() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tmp("non-utf8-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join(std::ffi::OsStr::from_bytes(b"limits-\xff"));
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_cuquota"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["limits".as_ref(), "init".as_ref(), f.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["limits".as_ref(), "show".as_ref(), f.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&[
        "limits".as_ref(),
        "set".as_ref(),
        f.as_os_str(),
        "--device".as_ref(),
        "0".as_ref(),
        "--memory".as_ref(),
        std::ffi::OsStr::from_bytes(b"4\xffg"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("cuquota: ") && err.contains("UTF-8"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_output_matches_the_documented_schemas() {
    // A path with characters JSON must escape.
    let f = tmp("json \"q\"\\\t");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let o = cuquota(&["limits", "show", fs, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert_eq!(v["limits_file"], fs);
    for dev in ["all", "3", "GPU-0f3a9c1e-1111-2222-3333-444455556666"] {
        let o = cuquota(&[
            "limits", "set", fs, "--device", dev, "--memory", "3000m", "--sm", "30", "--json",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    }
    let o = cuquota(&["limits", "show", fs, "--json"]);
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    let uuid_entry = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["device"] == "GPU-0f3a9c1e-1111-2222-3333-444455556666")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(uuid_entry["uuid"], uuid_entry["device"]);
    assert!(uuid_entry["index"].is_null());
    let o = cuquota(&["limits", "clear", fs, "--device", "3", "--json"]);
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert_eq!(v["entries"].as_array().unwrap().len(), 2, "{v}");
    let _ = std::fs::remove_file(&f);

    let u = tmp("json-usage");
    let r = UsageRegion::open(&u).unwrap();
    let slot = r.process_slot().unwrap();
    let dev = r.device(&[9; 16]).unwrap();
    r.report_limits(
        dev,
        &cuquota_core::Policy {
            memory: Some(1 << 30),
            ..cuquota_core::Policy::NONE
        },
    );
    r.try_charge(slot, dev, 1 << 20, Some(1 << 30)).unwrap();
    for interval in ["0", "50ms"] {
        let o = cuquota(&[
            "status",
            "--usage",
            u.to_str().unwrap(),
            "--json",
            "--interval",
            interval,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let v = check_schema("status.v1.json", &String::from_utf8(o.stdout).unwrap());
        assert_eq!(
            v["devices"][0]["processes"][0]["memory_used_bytes"],
            1u64 << 20,
            "{v}"
        );
        assert_eq!(v["devices"][0]["share_percent"].is_null(), interval == "0", "{v}");
    }
    let _ = std::fs::remove_file(&u);
}

#[test]
fn concurrent_limits_set_from_many_processes_loses_no_update() {
    let f = tmp("concurrent");
    let fs = f.to_str().unwrap().to_string();
    assert!(cuquota(&["limits", "init", &fs]).status.success());
    // 12 processes, each its own device, plus pairs editing different fields of one shared entry.
    let mut children = Vec::new();
    for i in 0..12u32 {
        children.push(
            Command::new(env!("CARGO_BIN_EXE_cuquota"))
                .args([
                    "limits",
                    "set",
                    &fs,
                    "--device",
                    &i.to_string(),
                    "--memory",
                    &format!("{}m", i + 1),
                ])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let field: [&str; 2] = match i % 3 {
            0 => ["--sm", "40"],
            1 => ["--weight", "9"],
            _ => ["--policy", "hard"],
        };
        children.push(
            Command::new(env!("CARGO_BIN_EXE_cuquota"))
                .args(["limits", "set", &fs, "--device", "all", field[0], field[1]])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let reader = LimitsReader::open(&f).unwrap();
    let snap = reader.snapshot();
    for i in 0..12u32 {
        let e = snap.get(DeviceSelector::Index(i)).expect("entry written");
        assert_eq!(e.memory_limit, u64::from(i + 1) << 20, "device {i}");
    }
    let all = snap.get(DeviceSelector::All).unwrap();
    assert_eq!((all.sm_limit, all.weight), (40, 9));
    assert_eq!(all.policy, cuquota_core::region::layout::POLICY_HARD);
    assert_eq!(snap.generation, 24, "one generation per update, none lost");
    let _ = std::fs::remove_file(&f);
}

#[test]
fn status_usage_file_from_the_environment_like_the_shim() {
    // HAMi's variable names HAMi's file; the usage file is beside it (X.cache -> X.cuquota-usage).
    let hami = tmp("env-usage.cache");
    let u = cuquota_core::config::usage_path_beside(&hami);
    UsageRegion::open(&u).unwrap();
    let (hs, us) = (hami.to_str().unwrap(), u.to_str().unwrap());
    let status = |vars: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cuquota"));
        c.args(["status", "--json", "--interval", "0"])
            .env_remove("CUQUOTA_USAGE_FILE")
            .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    // HAMi's name alone, with an empty cuquota twin (empty = unset), and with ours naming the file (ours wins).
    for vars in [
        vec![("CUDA_DEVICE_MEMORY_SHARED_CACHE", hs)],
        vec![
            ("CUQUOTA_USAGE_FILE", ""),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", hs),
        ],
        vec![
            ("CUQUOTA_USAGE_FILE", us),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/other.cache"),
        ],
    ] {
        let o = status(&vars);
        assert!(o.status.success(), "{vars:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(us),
            "{vars:?}: {}",
            text(&o)
        );
    }
    let _ = std::fs::remove_file(&u);
}

/// Every command and subcommand has --help and -h (stdout, exit 0); the top level has --version and -V.
#[test]
fn help_and_version_everywhere() {
    let commands: &[&[&str]] = &[
        &[],
        &["limits"],
        &["limits", "init"],
        &["limits", "set"],
        &["limits", "clear"],
        &["limits", "show"],
        &["status"],
        &["run"],
        &["demo"],
        &["metrics"],
        &["agent"],
        &["completions"],
    ];
    for cmd in commands {
        for flag in ["--help", "-h"] {
            let mut args = cmd.to_vec();
            args.push(flag);
            let o = cuquota(&args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("Usage: cuquota"), "{args:?}: {out}");
            assert!(o.stderr.is_empty(), "{args:?}");
        }
    }
    let long = String::from_utf8(cuquota(&["--help"]).stdout).unwrap();
    assert!(long.contains("Exit codes:") && long.contains("128+N"), "{long}");
    for flag in ["--version", "-V"] {
        let o = cuquota(&[flag]);
        assert_eq!(o.status.code(), Some(0));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            format!("cuquota {}", env!("CARGO_PKG_VERSION"))
        );
    }
    // Nothing at all: the usage on stderr, exit 2.
    let o = cuquota(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Usage: cuquota"));
}

#[test]
fn shell_completions_are_generated() {
    for (shell, marker) in [
        ("bash", "_cuquota()"),
        ("zsh", "#compdef cuquota"),
        ("fish", "complete -c cuquota"),
        ("elvish", "cuquota"),
        ("powershell", "cuquota"),
    ] {
        let o = cuquota(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", text(&o));
        let s = String::from_utf8(o.stdout).unwrap();
        assert!(s.contains(marker) && s.contains("limits"), "{shell}: {s}");
    }
    let o = cuquota(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn limits_set_priority_and_show_it() {
    let f = tmp("priority");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let o = cuquota(&[
        "limits",
        "set",
        fs,
        "--device",
        "all",
        "--priority",
        "low",
        "--sm",
        "20",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("low"), "{}", text(&o));
    let reader = LimitsReader::open(&f).unwrap();
    let p = reader.snapshot().for_device(None, Some(0));
    assert_eq!(p.priority, Some(cuquota_core::Priority::Low));
    assert_eq!(p.sm, Some(20));
    let o = cuquota(&["limits", "show", fs, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["entries"][0]["priority"], "low", "{v}");
    // cleared again; other fields kept
    assert!(
        cuquota(&["limits", "set", fs, "--device", "all", "--priority", "none"])
            .status
            .success()
    );
    let reader = LimitsReader::open(&f).unwrap();
    let p = reader.snapshot().for_device(None, Some(0));
    assert_eq!((p.priority, p.sm), (None, Some(20)));
    let o = cuquota(&["limits", "set", fs, "--device", "all", "--priority", "urgent"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("urgent") && text(&o).contains("--priority"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_file(&f);
}

#[test]
fn limits_set_request_beside_the_limit_and_status_shows_it() {
    let f = tmp("request");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let uuid = "GPU-07070707-0707-0707-0707-070707070707";
    // Control: a request at most the limit is stored beside it and shown.
    let o = cuquota(&[
        "limits",
        "set",
        fs,
        "--device",
        uuid,
        "--memory",
        "8g",
        "--request",
        "2g",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("REQUEST") && text(&o).contains("2 GiB"),
        "{}",
        text(&o)
    );
    let p = LimitsReader::open(&f)
        .unwrap()
        .snapshot()
        .for_device(Some(&[7; 16]), None);
    assert_eq!((p.memory, p.memory_request), (Some(8 << 30), Some(2 << 30)));
    let o = cuquota(&["limits", "show", fs, "--json"]);
    let v = check_schema("limits.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert_eq!(v["entries"][0]["memory_request_bytes"], 2u64 << 30, "{v}");
    // Bad input, each refused with exit 2 naming --request and the figures; nothing written.
    let gen = LimitsReader::open(&f).unwrap().snapshot().generation;
    for (args, words) in [
        (vec!["--request", "9g"], vec!["--request", "9 GiB", "8 GiB"]),
        (vec!["--memory", "1g"], vec!["--request", "2 GiB", "1 GiB"]),
        (vec!["--memory", "0"], vec!["--request", "without a memory limit"]),
        (vec!["--request", "2x"], vec!["--request", "2x"]),
    ] {
        let mut a = vec!["limits", "set", fs, "--device", uuid];
        a.extend(&args);
        let o = cuquota(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        for w in words {
            assert!(text(&o).contains(w), "{args:?}: `{w}` missing in {}", text(&o));
        }
    }
    assert_eq!(
        LimitsReader::open(&f).unwrap().snapshot().generation,
        gen,
        "nothing written"
    );
    // 0 clears it: the request is the limit again.
    assert!(
        cuquota(&["limits", "set", fs, "--device", uuid, "--request", "0"])
            .status
            .success()
    );
    let p = LimitsReader::open(&f)
        .unwrap()
        .snapshot()
        .for_device(Some(&[7; 16]), None);
    assert_eq!((p.memory_request, p.request_in_force()), (None, Some(8 << 30)));

    // status: the request from the limits file beside the limit the processes report.
    assert!(
        cuquota(&["limits", "set", fs, "--device", uuid, "--request", "3g"])
            .status
            .success()
    );
    let u = tmp("request-usage");
    let r = UsageRegion::open(&u).unwrap();
    let dev = r.device(&[7; 16]).unwrap();
    r.report_limits(
        dev,
        &cuquota_core::Policy {
            memory: Some(8 << 30),
            ..cuquota_core::Policy::NONE
        },
    );
    let us = u.to_str().unwrap();
    let o = cuquota(&[
        "status",
        "--usage",
        us,
        "--limits",
        fs,
        "--interval",
        "0",
        "--json",
    ]);
    let v = check_schema("status.v1.json", &String::from_utf8(o.stdout).unwrap());
    assert_eq!(v["devices"][0]["memory_request_bytes"], 3u64 << 30, "{v}");
    let o = cuquota(&["status", "--usage", us, "--limits", fs, "--interval", "0"]);
    assert!(
        text(&o).contains("REQUEST") && text(&o).contains("3 GiB"),
        "{}",
        text(&o)
    );
    // Without a limits file: none shown (null), the limit is what is guaranteed.
    let o = cuquota(&["status", "--usage", us, "--interval", "0", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["devices"][0]["memory_request_bytes"],
        serde_json::Value::Null,
        "{v}"
    );
    let _ = std::fs::remove_file(&f);
    let _ = std::fs::remove_file(&u);
}

#[test]
fn limits_set_evict_sets_and_clears_only_its_entrys_bit() {
    let f = tmp("evict");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let mask = || LimitsReader::open(&f).unwrap().snapshot().table.evict_mask;
    let set = |args: &[&str]| {
        let o = cuquota(&[&["limits", "set", fs][..], args].concat());
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    // Entry 0 (ordinal 0) is never asked; entry 1 (all) is, then ordinal 0 too, then all's ask ends.
    set(&["--device", "0", "--memory", "1g"]);
    assert_eq!(mask(), 0);
    set(&[
        "--device",
        "all",
        "--memory",
        "2g",
        "--request",
        "1g",
        "--evict",
        "on",
    ]);
    assert_eq!(mask(), 0b10);
    set(&["--device", "0", "--evict", "on"]);
    assert_eq!(mask(), 0b11);
    set(&["--device", "all", "--evict", "off"]);
    assert_eq!(mask(), 0b01);
    let o = cuquota(&["limits", "set", fs, "--device", "0", "--evict", "maybe"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(mask(), 0b01, "a refused value writes nothing");
    let _ = std::fs::remove_file(&f);
}
