//! End-to-end tests of the `cuquota` binary against real region files.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use cuquota_core::region::{DeviceSelector, LimitsReader, UsageRegion};

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
    assert!(cuquota(&["limits", "set", fs, "--device=1", "--weight", "7"])
        .status
        .success());
    reader.refresh();
    let e = *reader.snapshot().get(DeviceSelector::Index(1)).unwrap();
    assert_eq!((e.memory_limit, e.weight), (3000 << 20, 7));

    let o = cuquota(&["limits", "show", fs, "--json"]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(
        s.contains("\"device\":\"1\"") && s.contains("\"memory_limit\":3145728000"),
        "{s}"
    );

    assert!(cuquota(&["limits", "clear", fs, "--device", "1"])
        .status
        .success());
    reader.refresh();
    assert_eq!(reader.snapshot().for_device(None, Some(1)).memory, None);
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
        assert!(
            String::from_utf8_lossy(&o.stderr).starts_with("cuquota: "),
            "{bad:?}"
        );
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
    let s = String::from_utf8(o.stdout).unwrap();
    let share: f64 = s
        .split("\"share_percent\":")
        .nth(1)
        .unwrap()
        .split([',', '}'])
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((15.0..35.0).contains(&share), "achieved share {share} from {s}");
    assert!(s.contains("\"used\":1610612736"), "{s}");
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
fn non_utf8_argument_is_an_error_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let o = Command::new(env!("CARGO_BIN_EXE_cuquota"))
        .args([
            "limits".as_ref(),
            "show".as_ref(),
            std::ffi::OsStr::from_bytes(b"/tmp/\xff"),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("cuquota: ") && err.contains("UTF-8"), "{err}");
}

/// A strict JSON syntax check (RFC 8259), enough to prove `--json` output parses.
fn assert_json(s: &str) {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b'\r') {
            *i += 1;
        }
    }
    fn value(b: &[u8], i: &mut usize) -> Result<(), usize> {
        ws(b, i);
        match b.get(*i).ok_or(*i)? {
            b'{' => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    return Ok(());
                }
                loop {
                    ws(b, i);
                    string(b, i)?;
                    ws(b, i);
                    (b.get(*i) == Some(&b':')).then_some(()).ok_or(*i)?;
                    *i += 1;
                    value(b, i)?;
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            return Ok(());
                        }
                        _ => return Err(*i),
                    }
                }
            }
            b'[' => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    return Ok(());
                }
                loop {
                    value(b, i)?;
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b']') => {
                            *i += 1;
                            return Ok(());
                        }
                        _ => return Err(*i),
                    }
                }
            }
            b'"' => string(b, i),
            b't' | b'f' | b'n' => {
                for lit in ["true", "false", "null"] {
                    if b[*i..].starts_with(lit.as_bytes()) {
                        *i += lit.len();
                        return Ok(());
                    }
                }
                Err(*i)
            }
            _ => number(b, i),
        }
    }
    fn string(b: &[u8], i: &mut usize) -> Result<(), usize> {
        (b.get(*i) == Some(&b'"')).then_some(()).ok_or(*i)?;
        *i += 1;
        loop {
            match *b.get(*i).ok_or(*i)? {
                b'"' => {
                    *i += 1;
                    return Ok(());
                }
                b'\\' => {
                    *i += 1;
                    match *b.get(*i).ok_or(*i)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => *i += 1,
                        b'u' if b.len() >= *i + 5 && b[*i + 1..*i + 5].iter().all(u8::is_ascii_hexdigit) => {
                            *i += 5
                        }
                        _ => return Err(*i),
                    }
                }
                c if c < 0x20 => return Err(*i),
                _ => *i += 1,
            }
        }
    }
    fn number(b: &[u8], i: &mut usize) -> Result<(), usize> {
        let start = *i;
        if b.get(*i) == Some(&b'-') {
            *i += 1;
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - s
        };
        let int_start = *i;
        let n = digits(i);
        if n == 0 || (n > 1 && b[int_start] == b'0') {
            return Err(start);
        }
        if b.get(*i) == Some(&b'.') {
            *i += 1;
            if digits(i) == 0 {
                return Err(start);
            }
        }
        if matches!(b.get(*i), Some(b'e' | b'E')) {
            *i += 1;
            if matches!(b.get(*i), Some(b'+' | b'-')) {
                *i += 1;
            }
            if digits(i) == 0 {
                return Err(start);
            }
        }
        Ok(())
    }
    let b = s.as_bytes();
    let mut i = 0;
    let r = value(b, &mut i).and_then(|()| {
        ws(b, &mut i);
        (i == b.len()).then_some(()).ok_or(i)
    });
    if let Err(at) = r {
        panic!("invalid JSON at byte {at}: {s}");
    }
}

#[test]
fn json_output_is_valid_json() {
    for bad in ["{\"a\":}", "[1,]", "{\"a\":01}", "\"\t\"", "{} x"] {
        assert!(
            std::panic::catch_unwind(|| assert_json(bad)).is_err(),
            "{bad} accepted"
        );
    }
    // A path with characters JSON must escape.
    let f = tmp("json \"q\"\\\t");
    let fs = f.to_str().unwrap();
    assert!(cuquota(&["limits", "init", fs]).status.success());
    let o = cuquota(&["limits", "show", fs, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_json(&String::from_utf8(o.stdout).unwrap());
    for dev in ["all", "3", "GPU-0f3a9c1e-1111-2222-3333-444455556666"] {
        let o = cuquota(&[
            "limits", "set", fs, "--device", dev, "--memory", "3000m", "--sm", "30",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = cuquota(&["limits", "show", fs, "--json"]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert_json(&s);
    assert!(
        s.contains("\"device\":\"GPU-0f3a9c1e-1111-2222-3333-444455556666\""),
        "{s}"
    );
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
    for interval in ["0", "50"] {
        let o = cuquota(&[
            "status",
            "--usage",
            u.to_str().unwrap(),
            "--json",
            "--interval",
            interval,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        assert_json(&String::from_utf8(o.stdout).unwrap());
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
    let u = tmp("env-usage");
    UsageRegion::open(&u).unwrap();
    let us = u.to_str().unwrap();
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
    // HAMi's name alone, and with an empty cuquota twin (empty = unset, not "use the default").
    for vars in [
        vec![("CUDA_DEVICE_MEMORY_SHARED_CACHE", us)],
        vec![
            ("CUQUOTA_USAGE_FILE", ""),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", us),
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
    // Two different files named: the shim refuses this, so status must not guess.
    let o = status(&[
        ("CUQUOTA_USAGE_FILE", "/tmp/other"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", us),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_file(&u);
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
    assert!(text(&o).contains("\"priority\":\"low\""), "{}", text(&o));
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
    assert!(text(&o).contains("--priority \"urgent\""), "{}", text(&o));
    let _ = std::fs::remove_file(&f);
}
