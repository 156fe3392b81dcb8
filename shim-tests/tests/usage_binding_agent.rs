//! Issue 21 item 6, agent side: binding a container's usage file never stops the agent's backstop.
//!
//! The review found `cuquota limits set L --usage PATH` taking the bound file's identity INSIDE the limits
//! file's seqlock write, with a blocking `open` that followed links: PATH lives in the tenant's writable
//! directory, so a FIFO planted there made the administrator's command block for ever with the seqlock held.
//! Every reader of the limits file then failed ("limits are being written (writer pid …)"), the node agent
//! included, which skipped enforcement for that container: a tenant process that bypasses the library held
//! 800 MiB under a 512 MiB cap and was never killed. The identity is now taken before the write, from a
//! descriptor opened without blocking (a FIFO is refused at once): the agent kills the tenant as it does
//! when the binding succeeds (the control).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use shim_tests::{cli_bin, program, Proc, Prog, Sim};

const INTERVAL_MS: u64 = 200;

fn limits(sim: &Sim, file: &Path, args: &[&str]) {
    let f = file.to_str().unwrap();
    assert!(sim.cli(&["limits", "init", f]).success());
    let mut a = vec!["limits", "set", f, "--device", "all"];
    a.extend_from_slice(args);
    let o = sim.cli(&a);
    assert!(o.success(), "{o:?}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn passes(port: u16) -> u64 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.lines()
        .find_map(|l| l.strip_prefix("cuquota_agent_passes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

fn alive(pid: u32) -> bool {
    let st = cuquota_core::region::liveness::read_stat(pid).map(|s| s.state);
    !matches!(st, Some(b'Z') | Some(b'X') | None)
}

#[test]
fn a_fifo_at_the_bound_path_leaves_the_agents_backstop_on() {
    bind_while_a_bypassing_tenant_is_over(true);
}

/// Control: the same with a regular (initialised) usage file at the path: the binding completes and the agent
/// kills the tenant.
#[test]
fn control_a_regular_file_at_the_bound_path() {
    bind_while_a_bypassing_tenant_is_over(false);
}

fn bind_while_a_bypassing_tenant_is_over(plant_fifo: bool) {
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.f");
    limits(&sim, &lim, &["--memory", "512m"]);
    let probe = program(Prog::Probe).display().to_string();
    // The tenant's writable directory, where the administrator will bind its usage file.
    let tdir = sim.dir().join("tenant");
    std::fs::create_dir(&tdir).unwrap();
    let fifo = tdir.join("usage");
    if plant_fifo {
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    } else {
        cuquota_core::UsageRegion::open(&fifo).unwrap();
    }

    // A tenant process that bypasses the library: 800 MiB under a 512 MiB cap.
    let mut t = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("run -q --usage")
        .arg(sim.dir().join("usage.f").to_str().unwrap())
        .args("-- env -u LD_PRELOAD")
        .arg(&probe)
        .args("init pid alloc:mem:800m wait")
        .spawn();
    t.wait_ready(1);
    let tenant: u32 = t.wait_for("pid").parse().unwrap();
    std::fs::write(
        dir.join("f.toml"),
        format!(
            "limits = {lim:?}\n[members]\n{}\n[enforce]\nmemory = \"kill\"\n",
            t.subtree()
        ),
    )
    .unwrap();

    // The administrator binds the container's usage file (re-binding a running container, or binding it
    // when the path is the same on the node): it used to block on the tenant's FIFO with the seqlock held.
    let admin: Proc = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("limits set")
        .arg(lim.to_str().unwrap())
        .args("--device all --usage")
        .arg(fifo.to_str().unwrap())
        .spawn();
    std::thread::sleep(Duration::from_millis(500));

    let port = free_port();
    let agent = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args(&format!("agent --interval {INTERVAL_MS}ms --json --containers"))
        .arg(dir.to_str().unwrap())
        .arg("--listen")
        .arg(&format!("127.0.0.1:{port}"))
        .spawn();
    let deadline = Instant::now() + Duration::from_millis(30 * INTERVAL_MS);
    while alive(tenant) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = passes(port);
    let survived = alive(tenant);
    let truth = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    // SAFETY: signalling processes this test started, by pid.
    unsafe {
        libc::kill(admin.pid() as i32, libc::SIGKILL);
        libc::kill(agent.pid() as i32, libc::SIGTERM);
    }
    let ao = agent.finish();
    let _ = admin.kill();
    t.release();
    let _ = t.finish();
    let skipped = ao.stderr.lines().filter(|l| l.contains("being written")).count();
    assert!(
        !survived,
        "a bypassing tenant held {} MiB under a 512 MiB cap for 30 agent intervals ({n} passes) while the \
         administrator's `limits set --usage` hung on the tenant's FIFO; agent lines about the stuck writer: \
         {skipped}\n{}",
        truth.num("sim.used.0") >> 20,
        ao.stderr.lines().take(6).collect::<Vec<_>>().join("\n")
    );
}

/// The agent reports a container's own accounting from the usage file its descriptor names; where the limits
/// file binds another file (the tenant replaced the one at the path, or the descriptor is stale), those figures
/// are not the container's, and are left out (control: reported while nothing is bound).
#[test]
fn the_agent_reports_no_usage_file_but_the_bound_one() {
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.f");
    limits(&sim, &lim, &["--memory", "1g"]);
    let named = sim.dir().join("named-usage");
    let mut p = sim
        .cmd(Prog::Probe)
        .env("CUQUOTA_USAGE_FILE", named.to_str().unwrap())
        .args("init alloc:mem:100m wait")
        .spawn();
    p.wait_ready(1);
    std::fs::write(
        dir.join("c.toml"),
        format!(
            "limits = {lim:?}\nusage = {named:?}\n[members]\n{}\n",
            p.subtree()
        ),
    )
    .unwrap();
    let reported = || {
        let out = sim.cli(&["agent", "--containers", dir.to_str().unwrap(), "--once", "--json"]);
        assert!(out.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_str(&out.lines.join("\n")).unwrap();
        v["containers"][0]["devices"][0]["reported"].clone()
    };
    let before = reported();
    let other = sim.dir().join("bound-usage");
    let o = other.to_str().unwrap();
    let bind = sim.cli(&[
        "limits",
        "set",
        lim.to_str().unwrap(),
        "--device",
        "all",
        "--usage",
        o,
        "--usage-host",
        o,
    ]);
    assert!(bind.success(), "{bind:?}");
    let after = reported();
    p.release();
    p.finish();
    assert!(
        before["memory_used_bytes"].as_u64().unwrap_or(0) >= 100 << 20,
        "control: {before}"
    );
    assert!(
        after.is_null(),
        "figures of a file the limits file does not bind: {after}"
    );
}
