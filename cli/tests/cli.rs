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
    assert_eq!(l.policy, Some(cuquota_core::Policy::Hard));

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
    r.set_reported_limits(dev, Some(4 << 30), Some(30));
    r.try_charge(slot, dev, 3 << 29, Some(4 << 30)).unwrap();
    // A dead process's slot, to be reclaimed by status.
    let ghost = r.claim_slot_as(i32::MAX as u32 - 3, 1).unwrap();
    r.try_charge(ghost, dev, 1 << 30, None).unwrap();

    // Simulate the throttle accounting GPU time while status samples: ~25% busy.
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
    let o = cuquota(&["status", "--usage", f.to_str().unwrap(), "--interval", "400"]);
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
        "400",
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
