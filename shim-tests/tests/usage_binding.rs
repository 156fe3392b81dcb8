//! Class 7 of issue 11 (part): the agent's limits file binds the container's usage file, so a process started
//! with `CUQUOTA_USAGE_FILE` pointing at a private file does not get a private cap. Four processes, each with
//! its own usage file, under an agent file with a 1 GiB cap that names the container's usage file: together
//! they stay within 1 GiB by the simulator's own count. Issue 21, item 6: the binding names the file itself
//! (its identity), so a file put at the bound path is no fresh cap either.

use shim_tests::{Prog, Sim, GIB};

#[test]
fn private_usage_files_do_not_multiply_the_agent_cap() {
    let sim = bound_sim();

    let mut procs = Vec::new();
    for i in 0..4 {
        let private = sim.dir().join(format!("private-usage-{i}"));
        let mut p = sim
            .cmd(Prog::Probe)
            .env("CUQUOTA_USAGE_FILE", private.to_str().unwrap())
            .args("init alloc:mem:400m wait")
            .spawn();
        p.wait_ready(1);
        procs.push(p);
    }
    let truth = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    truth.ok();
    let used = truth.num("sim.used.0");
    let mut granted = 0;
    for mut p in procs {
        p.release();
        let out = p.finish();
        out.ok();
        granted += usize::from(out.val("alloc.0") == "CUDA_SUCCESS");
    }
    assert!(
        (1..=2).contains(&granted),
        "{granted} of 4 allocations of 400m (+64m context each) granted under a shared 1 GiB cap"
    );
    assert!(
        used <= GIB,
        "4 processes with private usage files hold {} MiB under a 1 GiB agent cap:{truth:?}",
        used >> 20
    );
}

/// Binds the default container's usage file (with its identity) in a fresh limits file with a 1 GiB cap on
/// device 0.
fn bound_sim() -> Sim {
    let sim = Sim::new().ctx_overhead("64m").build();
    sim.agent_memory_limit(0, "1g");
    let usage = sim.usage_file();
    let usage = usage.to_str().unwrap();
    let file = sim.limits_file();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "0",
        "--usage",
        usage,
        "--usage-host",
        usage,
    ]);
    assert!(out.success(), "binding the usage file failed:{out:?}");
    sim
}

/// Issue 21, item 6: one process of the container holds 600 MiB of a 1 GiB cap; the tenant then moves the
/// bound usage file out of the way in its writable directory (`replace`), and a second process asks for
/// 600 MiB more. Bound by path alone (main), the second process found a fresh, empty file at the path (created
/// it, or took the one the tenant put there) and got the whole cap again. Bound by identity it is refused,
/// with an error naming the file; the simulator's own count stays within the cap.
fn replaced_usage_file_fails_closed(replace: impl FnOnce(&std::path::Path, &std::path::Path)) {
    let sim = bound_sim();
    let usage = sim.usage_file();
    let snapshot = sim.dir().join("usage-snapshot");
    // what a tenant could copy while the file was still empty
    let first = sim.cmd(Prog::Probe).args("init").run();
    first.ok();
    std::fs::copy(&usage, &snapshot).unwrap();

    let mut holder = sim.cmd(Prog::Probe).args("init alloc:mem:600m wait").spawn();
    holder.wait_ready(1);
    replace(&usage, &snapshot);
    let mut second = sim.cmd(Prog::Probe).args("init alloc:mem:600m wait").spawn();
    second.wait_ready(1);
    let truth = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    truth.ok();
    second.release();
    let second = second.finish();
    holder.release();
    let held = holder.finish();
    held.ok();
    assert_eq!(held.val("alloc.0"), "CUDA_SUCCESS", "{held:?}");

    let used = truth.num("sim.used.0");
    assert!(
        used <= GIB,
        "{} MiB held under a 1 GiB cap after the bound usage file was replaced:{second:?}{truth:?}",
        used >> 20
    );
    assert!(
        second.get("alloc.0") != Some("CUDA_SUCCESS"),
        "the second process was granted 600 MiB:{second:?}"
    );
    let usage_name = usage.display().to_string();
    assert!(
        second.stderr.contains(&usage_name) && second.stderr.contains("not the usage file the agent bound"),
        "the refusal must name the bound file and say why:{second:?}"
    );
}

#[test]
fn a_renamed_bound_usage_file_is_not_replaced_by_a_fresh_one() {
    // renamed away: the next process would create a fresh one at the path
    replaced_usage_file_fails_closed(|usage, _| {
        std::fs::rename(usage, usage.with_extension("moved")).unwrap();
    });
}

#[test]
fn a_bound_usage_file_replaced_by_an_old_copy_is_refused() {
    // an old copy (valid header, no charges) renamed over the bound file: same content, another file
    replaced_usage_file_fails_closed(|usage, snapshot| {
        std::fs::rename(snapshot, usage).unwrap();
    });
}

/// Issue 21, item 6: a running process that the agent's limits file no longer binds to the file it accounts in
/// (the agent bound the container to a new file) admits nothing more under the cap: what it would charge in
/// the old file, the processes accounting in the new one would not see. Noticed at the limits file's next
/// generation, not per allocation. Bound by path (main), it kept allocating.
#[test]
fn a_running_process_allocates_no_more_once_the_agent_binds_another_file() {
    let sim = bound_sim();
    let mut holder = sim
        .cmd(Prog::Probe)
        .args("init alloc:mem:100m wait alloc:mem:100m")
        .spawn();
    holder.wait_ready(1);
    let fresh = sim.dir().join("usage-rebound");
    let fresh = fresh.to_str().unwrap();
    let file = sim.limits_file();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "0",
        "--usage",
        fresh,
        "--usage-host",
        fresh,
    ]);
    assert!(out.success(), "re-binding failed:{out:?}");
    holder.release();
    let out = holder.finish();
    out.ok();
    assert_eq!(out.val("alloc.0"), "CUDA_SUCCESS", "{out:?}");
    assert_ne!(
        out.val("alloc.1"),
        "CUDA_SUCCESS",
        "an allocation charged to a usage file the agent no longer binds:{out:?}"
    );
    assert!(
        out.stderr.contains("binds the container to another usage file"),
        "the refusal must say why:{out:?}"
    );
}

/// `cuquota limits set --usage` with its arguments, bounded by `secs` (a hang is a failure, not a stuck test).
fn bind_command(sim: &Sim, args: &[&str], secs: u64) -> shim_tests::Output {
    let file = sim.limits_file();
    let mut c = sim
        .cmd_path(shim_tests::cli_bin())
        .no_preload()
        .timeout(std::time::Duration::from_secs(secs))
        .args("limits set")
        .arg(file.to_str().unwrap())
        .args("--device all");
    for a in args {
        c = c.arg(a);
    }
    c.run()
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
}

/// Review of issue 21 item 6: a FIFO the tenant plants at the path to bind made `limits set --usage` block
/// in `open` while it held the limits file's write lock (every reader, the agent included, then failed). The
/// identity is now taken before the write, from the descriptor opened without blocking: the command fails
/// at once, naming the path, and the limits file stays readable.
#[test]
fn binding_a_fifo_fails_at_once_and_leaves_the_limits_readable() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    let fifo = sim.dir().join("tenant-usage");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    for args in [&["--usage", f][..], &["--usage", f, "--usage-host", f][..]] {
        let out = bind_command(&sim, args, 20);
        assert!(!out.timed_out, "`limits set {args:?}` hung on a FIFO:{out:?}");
        assert!(!out.success(), "a FIFO was bound:{out:?}");
        assert!(
            out.stderr.contains(f) && out.stderr.contains("not a regular file"),
            "the error must name the path and say why:{out:?}"
        );
        let show = sim.cli(&["limits", "show", sim.limits_file().to_str().unwrap()]);
        assert!(
            show.success(),
            "the limits file is unreadable after a failed binding:{show:?}"
        );
    }
}

/// Review of issue 21 item 6: the bind command (run as root) followed a symbolic link the tenant made in the
/// path's directories and created a 0666 usage file wherever the link pointed. It follows none now: it fails
/// naming the link, and nothing is created.
#[test]
fn binding_follows_no_symbolic_link_in_the_path() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    let tenant = sim.dir().join("tenant");
    let elsewhere = sim.dir().join("not-the-tenants");
    std::fs::create_dir(&tenant).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, tenant.join("run")).unwrap();
    let through = tenant.join("run/usage");
    let t = through.to_str().unwrap();
    for args in [&["--usage", t, "--usage-host", t][..], &["--usage", t][..]] {
        let out = bind_command(&sim, args, 20);
        assert!(!out.success(), "bound through a symbolic link:{out:?}");
        assert!(
            out.stderr.contains("is a symbolic link")
                && out.stderr.contains(tenant.join("run").to_str().unwrap()),
            "the error must name the link:{out:?}"
        );
        assert!(
            !elsewhere.join("usage").exists(),
            "a usage file was created where the link pointed:{out:?}"
        );
    }
}

/// Review of issue 21 item 6 (layout reuse): an older agent's limits file (same ABI version 4, before the bound
/// file's identity took the last 24 bytes of the path field) may bind a usage path of 481..504 bytes. It was
/// read cut to 480 bytes with the path's tail taken for an identity: 481..488 bytes bound a truncated path
/// (another file, which the shim created) by path only; 489..504 bound a garbage identity. It is now an
/// unreadable binding, with its own error: a process under it refuses to start, naming the limits file.
#[test]
fn an_older_agents_long_usage_path_is_refused_not_misread() {
    use cuquota_core::region::layout::LimitsFile;
    use cuquota_core::region::LimitsReader;
    use std::io::{Seek, SeekFrom, Write};
    for len in [485usize, 500] {
        let sim = Sim::new().ctx_overhead("64m").build();
        sim.agent_memory_limit(0, "1g");
        let file = sim.limits_file();
        // What an agent before identities wrote: len and `len` path bytes, zero after.
        let mut path = sim.dir().display().to_string();
        path.push('/');
        while path.len() < len {
            path.push('a');
        }
        let off = std::mem::offset_of!(LimitsFile, usage) as u64;
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&(len as u32).to_le_bytes()).unwrap();
        f.write_all(&[0; 4]).unwrap();
        f.write_all(path.as_bytes()).unwrap();
        drop(f);

        let r = LimitsReader::open(&file).unwrap();
        let e = r
            .snapshot()
            .usage_path()
            .expect_err("a path longer than the field");
        assert_eq!(e.len, len as u32);
        assert!(r.snapshot().usage_id().is_err());

        let out = sim.cmd(Prog::Probe).args("init alloc:mem:100m").run();
        assert_ne!(
            out.get("alloc.0"),
            Some("CUDA_SUCCESS"),
            "admitted under an unreadable binding:{out:?}"
        );
        assert!(
            out.stderr.contains(&format!("usage file path of {len} bytes"))
                && out.stderr.contains(file.to_str().unwrap()),
            "the refusal must say what is wrong with which file:{out:?}"
        );
        let truncated = &path[..cuquota_core::region::layout::LIMITS_USAGE_PATH_MAX];
        assert!(
            !std::path::Path::new(truncated).exists(),
            "a usage file was created at the truncated path"
        );
    }
}
