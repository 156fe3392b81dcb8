//! Review of issue 21 item 6 (the usage binding by identity). Reproductions of what still gets past it; they
//! are EXPECTED TO FAIL on rev-binding (b4ecae5): each failure is a finding.

use shim_tests::{compile_c, mono_ns, workspace_root, Prog, Sim, GIB};
use std::path::PathBuf;
use std::time::Duration;

fn launcher() -> PathBuf {
    compile_c(
        "throttle_paths_dl",
        &workspace_root().join("shim-tests/c/throttle_paths.c"),
        &[],
        &["-ldl"],
    )
}

fn bind(sim: &Sim, usage: &std::path::Path) {
    let file = sim.limits_file();
    let u = usage.to_str().unwrap();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "all",
        "--usage",
        u,
        "--usage-host",
        u,
    ]);
    assert!(out.success(), "binding failed:{out:?}");
}

/// FINDING (SM): a process whose usage file is no longer the bound one (it started before the agent bound the
/// container, or the agent re-bound it) is "superseded", but `UsageRegion::check` is consulted only by memory
/// admissions (src/memory/mod.rs:180): its launches keep drawing on the SM-time bucket of its old file, which
/// the processes in the bound file never see. Two processes of one container under a hard 20 % limit: the
/// device runs ~2 × 20 %.
#[test]
fn a_superseded_process_keeps_its_own_sm_bucket() {
    let sim = Sim::new().build();
    sim.agent_sm_limit_hard(20);
    let secs_p = 4.0;
    let t0 = mono_ns() + 300_000_000;
    // P: started before the binding, accounting in container "a"'s file (its environment's).
    let mut p = sim
        .cmd_path(launcher())
        .container("a")
        .timeout(Duration::from_secs(60))
        .args(&format!("kernel dlsym {secs_p} 1000000 1 {t0}"))
        .spawn();
    std::thread::sleep(Duration::from_millis(800));
    // The agent binds the container to its file "b" (by identity).
    let b = sim.container_usage_file("b");
    // create + initialise it the way the agent would (--usage-host creates it)
    bind(&sim, &b);
    std::thread::sleep(Duration::from_millis(300));
    let t1 = mono_ns() + 200_000_000;
    let q = sim
        .cmd_path(launcher())
        .container("b")
        .timeout(Duration::from_secs(60))
        .args(&format!("kernel dlsym 2.0 1000000 1 {t1}"))
        .spawn();
    let qo = q.finish();
    assert!(qo.success(), "{qo:?}");
    let po = p.finish();
    assert!(po.success(), "{po:?}");
    let w = qo.window();
    let total = sim.share_pct(0, 0, w.t0, w.end);
    let ps = sim.share_pct(0, po.window().pid, w.t0, w.end);
    let qs = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("device {total:.1} % (P {ps:.1} %, Q {qs:.1} %) under a container-wide hard 20 %");
    assert!(
        total <= 35.0,
        "one container held {total:.1} % of a device limited to 20 % (P superseded {ps:.1} %, Q bound {qs:.1} %)\
         \nP stderr: {}",
        po.stderr
    );
}

/// FINDING (memory, documented residual made concrete): the same superseded process keeps what it allocated
/// before the binding, uncharged in the bound file: 2 × the cap.
#[test]
fn a_process_started_before_the_binding_keeps_an_uncharged_cap() {
    let sim = Sim::new().ctx_overhead("64m").build();
    sim.agent_memory_limit(0, "1g");
    let mut p = sim
        .cmd(Prog::Probe)
        .container("a")
        .args("init alloc:mem:800m wait")
        .spawn();
    p.wait_ready(1);
    let b = sim.container_usage_file("b");
    bind(&sim, &b);
    let mut q = sim
        .cmd(Prog::Probe)
        .container("b")
        .args("init alloc:mem:800m wait")
        .spawn();
    q.wait_ready(1);
    let truth = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    truth.ok();
    q.release();
    let qo = q.finish();
    p.release();
    p.finish();
    let used = truth.num("sim.used.0");
    assert!(
        used <= GIB,
        "{} MiB held by one container under a 1 GiB cap (a process started before the binding):{qo:?}",
        used >> 20
    );
}

/// FINDING (layout reuse): an older agent's limits file may bind a usage path of 481..504 bytes (its limit was
/// 504). This version reads `len` clamped to 480 (core/src/region/limits.rs `load_table`, `usage_path`) and the
/// path's last bytes as the identity: 481..488 bytes → `ino` 0 → "bound by path only" to a TRUNCATED path
/// (another file, created by the shim with `Access::Create`); 489..504 → garbage `ino` → every process refused.
/// Neither is reported as what it is (an unreadable binding); a path longer than the field should fail closed
/// with its own error.
#[test]
fn an_old_limits_file_with_a_long_usage_path_is_misread() {
    use cuquota_core::region::layout::LimitsFile;
    use cuquota_core::region::{DeviceSelector, LimitsReader, LimitsWriter};
    use std::io::{Seek, SeekFrom, Write};
    let dir = std::env::temp_dir().join(format!("review-longpath-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut bad = Vec::new();
    for len in [485usize, 500] {
        let file = dir.join(format!("limits-{len}"));
        let _ = std::fs::remove_file(&file);
        let w = LimitsWriter::create(&file).unwrap();
        w.update(|t| {
            t.entry_mut(DeviceSelector::All)?.memory_limit = 1 << 30;
            Ok::<_, cuquota_core::region::TableFull>(())
        })
        .unwrap()
        .unwrap();
        drop(w);
        // What an ABI-4 agent before identities wrote: len and `len` path bytes, zero after.
        let mut path = String::from("/");
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
        let snap = r.snapshot();
        let seen = snap.usage_path().map(|p| p.as_os_str().len());
        let id = snap.usage_id();
        println!("old file, path of {len} bytes: read as a path of {seen:?} bytes, identity {id:?}");
        if seen != Some(len) {
            bad.push(format!(
                "{len}-byte path read as {seen:?} bytes with identity {id:?}"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "old bindings misread: {bad:?}");
}
