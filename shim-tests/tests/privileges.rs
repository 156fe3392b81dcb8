//! A process cannot write its own limits: the shim maps the agent's limits file read-only, and an
//! unprivileged process cannot open it for writing.
//!
//! Tests that drop privileges need root, so they are `#[ignore]`d with that reason: `./test.sh` runs them with
//! `--ignored` when it runs as root (as CI does) and says so when it cannot.

use shim_tests::{is_root, Prog, Sim, GIB, NOBODY};

#[test]
fn shim_maps_the_limits_file_read_only() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    let mut p = sim.cmd(Prog::Probe).args("init alloc:mem:64m wait").spawn();
    p.wait_ready(1);
    let pid = p.pid();
    let limits = std::fs::canonicalize(sim.limits_file()).expect("limits file");
    let limits = limits.to_str().expect("utf-8");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let mapped: Vec<&str> = maps.lines().filter(|l| l.ends_with(limits)).collect();
    assert!(
        !mapped.is_empty(),
        "the shim did not map the limits file {limits}:\n{maps}"
    );
    for l in &mapped {
        let perms = l.split_whitespace().nth(1).unwrap_or("");
        assert!(!perms.contains('w'), "limits file mapped writable: {l}");
    }
    // and any descriptor it keeps is read-only
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
    {
        if std::fs::read_link(fd.path())
            .ok()
            .and_then(|t| t.to_str().map(|s| s == limits))
            == Some(true)
        {
            let info =
                std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy()))
                    .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0);
            assert_eq!(
                flags & libc::O_ACCMODE as u32,
                libc::O_RDONLY as u32,
                "limits fd open for writing"
            );
        }
    }
    p.finish().ok();
}

#[test]
#[ignore = "needs root to drop to uid 65534: ./test.sh runs it with --ignored as root"]
fn unprivileged_process_cannot_write_the_limits_file() {
    assert!(is_root(), "needs root to drop to uid {NOBODY}");
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    // the temp dir must be reachable by nobody
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(sim.dir(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sh = sim
        .cmd_path("/bin/sh".into())
        .no_preload()
        .as_uid(NOBODY)
        .arg("-c")
        .arg(r#"if ( : >> "$0" ) 2>/dev/null; then echo open_rw=ok; else echo open_rw=denied; fi; echo done=1"#)
        .arg(sim.limits_file().to_str().expect("utf-8"))
        .run();
    assert!(sh.success(), "{sh:?}");
    sh.expect("open_rw", "denied");
    // while the shim, as that same user, still reads and obeys it
    // its own GPU state and usage files, in a dir it may write
    let own = sim.dir().join("nobody");
    std::fs::create_dir(&own).expect("mkdir");
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = sim
        .cmd(Prog::Probe)
        .as_uid(NOBODY)
        .env("CUQUOTA_USAGE_FILE", own.join("usage").to_str().expect("utf-8"))
        .env("CUDASIM_STATE", own.join("sim.state").to_str().expect("utf-8"))
        .mem_limit("4g")
        .args("init totalmem alloc:mem:1536m")
        .run();
    out.ok();
    assert_eq!(out.num("totalmem"), GIB, "{out:?}");
    out.expect("alloc.0", "CUDA_ERROR_OUT_OF_MEMORY");
}
