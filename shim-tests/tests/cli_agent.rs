//! `cuquota agent` against the simulator's NVML: containers described by `subtree` membership (each one a
//! `cuquota run`, a child subreaper), per-process memory and utilisation summed per container, compared with
//! each limits file, reported as JSON (schema cuquota.agent/v1) and as metrics scraped over 127.0.0.1.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use shim_tests::{check_schema, cli_bin, program, throttle_paths_direct, Output, Proc, Prog, Sim, MIB};

/// `cuquota run ARGS…` as a container of its own (its own usage file), spawned.
fn run_container(sim: &Sim, usage: &Path, args: &[&str]) -> Proc {
    let mut c = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("run -q --usage")
        .arg(usage.to_str().unwrap());
    for a in args {
        c = c.arg(a);
    }
    c.spawn()
}

fn cli(sim: &Sim, args: &[&str]) -> Output {
    sim.cli(args)
}

fn limits(sim: &Sim, file: &Path, args: &[&str]) {
    let f = file.to_str().unwrap();
    assert!(cli(sim, &["limits", "init", f]).success());
    let mut a = vec!["limits", "set", f, "--device", "all"];
    a.extend_from_slice(args);
    let o = cli(sim, &a);
    assert!(o.success(), "{o:?}");
}

fn descriptor(dir: &Path, name: &str, body: &str) {
    std::fs::write(dir.join(format!("{name}.toml")), body).unwrap();
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

#[test]
fn agent_reports_each_container_from_nvml() {
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let (lim_a, lim_b) = (sim.dir().join("limits.a"), sim.dir().join("limits.b"));
    let (use_a, use_b) = (sim.dir().join("usage.a"), sim.dir().join("usage.b"));
    // The agent's cap for a is below what a holds: the shim in a knows nothing of it (run's own cap is 1g),
    // the agent sees the truth in NVML and reports it over.
    limits(&sim, &lim_a, &["--memory", "256m"]);
    limits(
        &sim,
        &lim_b,
        &["--memory", "2g", "--sm", "30", "--policy", "hard"],
    );

    let probe = program(Prog::ProbeDirect).display().to_string();
    let mut a = run_container(
        &sim,
        &use_a,
        &[
            "--memory",
            "1g",
            "--",
            &probe,
            "init",
            "pid",
            "alloc:mem:300m",
            "wait",
        ],
    );
    a.wait_ready(1);
    let a_pid: u32 = a.wait_for("pid").parse().unwrap();
    let tp = throttle_paths_direct().display().to_string();
    let mut b = run_container(
        &sim,
        &use_b,
        &[
            "--limits",
            lim_b.to_str().unwrap(),
            "--",
            &tp,
            "kernel",
            "direct",
            "8",
            "1000000",
        ],
    );
    // Someone on the GPU who belongs to no described container.
    let mut stranger = sim
        .cmd(Prog::Probe)
        .container("x")
        .args("init pid alloc:mem:100m wait")
        .spawn();
    stranger.wait_ready(1);
    let stranger_pid: u32 = stranger.wait_for("pid").parse().unwrap();

    descriptor(
        &dir,
        "a",
        &format!(
            "namespace = \"team\"\npod = \"a-0\"\ncontainer = \"main\"\nlimits = {:?}\nusage = {:?}\n[members]\n{}\n",
            lim_a,
            use_a,
            a.subtree()
        ),
    );
    descriptor(
        &dir,
        "b",
        &format!("limits = {:?}\n[members]\n{}\n", lim_b, b.subtree()),
    );
    descriptor(&dir, "broken", "limits = \"/x\"\n");
    // b's launcher has been launching for more than a sampling interval (start-up may take long on a busy machine).
    b.wait_for("t0_ns");
    std::thread::sleep(Duration::from_millis(1500));

    let out = cli(
        &sim,
        &[
            "agent",
            "--containers",
            dir.to_str().unwrap(),
            "--once",
            "--json",
            "--interval",
            "1s",
        ],
    );
    assert!(out.success(), "{out:?}");
    let v = check_schema("agent.v1.json", &out.lines.join("\n"));
    let c = |name: &str| {
        v["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}: {v}"))
            .clone()
    };

    let ca = c("a");
    assert!(ca["error"].is_null(), "{ca}");
    let pids: Vec<u64> = ca["members"]["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert!(
        pids.contains(&u64::from(a.pid())) && pids.contains(&u64::from(a_pid)),
        "{ca}"
    );
    assert!(
        !pids.contains(&u64::from(b.pid())) && !pids.contains(&u64::from(stranger_pid)),
        "{ca}"
    );
    let da = &ca["devices"][0];
    assert_eq!(
        da["memory_used_bytes"],
        300 * MIB,
        "NVML's figure for a's one process:{ca}"
    );
    assert_eq!(da["processes"][0]["pid"], a_pid, "{ca}");
    assert_eq!(da["memory_limit_bytes"], 256 * MIB, "{ca}");
    assert_eq!(da["memory_over_limit"], true, "{ca}");
    assert_eq!(
        da["reported"]["memory_used_bytes"],
        300 * MIB,
        "a's own usage file agrees:{ca}"
    );
    assert_eq!(da["vdevice_index"], 0, "{ca}");
    assert_eq!(ca["actions"].as_array().unwrap().len(), 0, "report only:{ca}");

    let cb = c("b");
    let db = &cb["devices"][0];
    let util = db["utilization_percent"].as_f64().unwrap();
    assert!(
        (15.0..=45.0).contains(&util),
        "b runs at a hard 30 %: NVML says {util}:{cb}"
    );
    assert_eq!(db["sm_limit_percent"], 30, "{cb}");
    assert_eq!(db["policy"], "hard", "{cb}");
    assert_eq!(db["memory_over_limit"], false, "{cb}");

    assert!(c("broken")["error"].as_str().unwrap().contains("members"), "{v}");
    let unattributed: Vec<u64> = v["gpus"][0]["unattributed_pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(unattributed, [u64::from(stranger_pid)], "{v}");

    // The same, as metrics on 127.0.0.1 from a running agent; action counters exist and read 0.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let agent = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("agent --interval 200ms --containers")
        .arg(dir.to_str().unwrap())
        .arg("--listen")
        .arg(&format!("127.0.0.1:{port}"))
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        if let Some(b) = scrape(port).filter(|b| b.contains("hami_vgpu_memory_used_bytes{")) {
            break b;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics from the agent on 127.0.0.1:{port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let uuid = da["uuid"].as_str().unwrap();
    let la = format!(
        r#"namespace="team",pod="a-0",container="main",vdevice_index="0",device_uuid="{uuid}",name="a""#
    );
    for line in [
        format!("hami_vgpu_memory_used_bytes{{{la}}} 314572800.0"),
        format!("hami_vgpu_memory_limit_bytes{{{la}}} 268435456.0"),
        format!("cuquota_processes{{{la}}} 1.0"),
        r#"cuquota_agent_actions_total{namespace="team",pod="a-0",container="main",name="a",action="kill"} 0"#.into(),
        r#"cuquota_agent_actions_total{namespace="",pod="",container="",name="b",action="freeze"} 0"#.into(),
    ] {
        assert!(body.lines().any(|l| l == line), "missing `{line}`:\n{body}");
    }
    assert!(
        body.lines().any(|l| l.starts_with("cuquota_agent_passes_total ")),
        "{body}"
    );
    let out = agent.kill();
    assert!(out.stderr.contains("serving http://127.0.0.1:"), "{out:?}");

    let b = b.finish();
    assert!(b.success(), "{b:?}");
    a.release();
    assert!(a.finish().success());
    stranger.release();
    assert!(stranger.finish().success());
}

#[test]
fn agent_once_fails_clearly_without_nvml_or_directory() {
    let sim = Sim::new().build();
    let dir = sim.dir().join("none");
    let out = cli(&sim, &["agent", "--containers", dir.to_str().unwrap(), "--once"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("not a directory"), "{out:?}");
    std::fs::create_dir(&dir).unwrap();
    let out = sim
        .cmd_path(cli_bin())
        .no_preload()
        .env("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1")
        .args("agent --once --containers")
        .arg(dir.to_str().unwrap())
        .run();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("NVML"), "{out:?}");
}

#[test]
fn the_agent_refuses_a_memory_request_that_does_not_fit_the_gpu() {
    const UUID: &str = "GPU-00112233-4455-6677-8899-aabbccddeeff";
    let sim = Sim::new().memory("16g").uuids(UUID).build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let set = |file: &Path, args: &[&str]| {
        let f = file.to_str().unwrap();
        assert!(cli(&sim, &["limits", "init", f]).success());
        let mut a = vec!["limits", "set", f, "--device", UUID];
        a.extend_from_slice(args);
        let o = cli(&sim, &a);
        assert!(o.success(), "{o:?}");
    };
    let (lim_a, lim_b) = (sim.dir().join("limits.a"), sim.dir().join("limits.b"));
    // a is guaranteed 10 GiB (shown 12 GiB); b has no request: its 8 GiB cap is its guarantee. 18 > 16.
    set(&lim_a, &["--memory", "12g", "--request", "10g"]);
    set(&lim_b, &["--memory", "8g"]);
    let mut roots: Vec<std::process::Child> = (0..2)
        .map(|_| std::process::Command::new("sleep").arg("120").spawn().unwrap())
        .collect();
    for (name, lim, root) in [("a", &lim_a, &roots[0]), ("b", &lim_b, &roots[1])] {
        let members = shim_tests::subtree_members(root.id());
        descriptor(&dir, name, &format!("limits = {lim:?}\n[members]\n{members}\n"));
    }
    let pass = || {
        let out = cli(
            &sim,
            &[
                "agent",
                "--containers",
                dir.to_str().unwrap(),
                "--once",
                "--json",
                "--interval",
                "100ms",
            ],
        );
        assert!(out.success(), "{out:?}");
        check_schema("agent.v1.json", &out.lines.join("\n"))
    };
    let device = |v: &serde_json::Value, name: &str| {
        v["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}: {v}"))["devices"][0]
            .clone()
    };
    let v = pass();
    let (da, db) = (device(&v, "a"), device(&v, "b"));
    assert_eq!(da["memory_request_bytes"], 10u64 << 30, "{v}");
    assert!(da["memory_request_refused"].is_null(), "{v}");
    assert_eq!(db["memory_request_bytes"], 8u64 << 30, "no request: the cap, {v}");
    let why = db["memory_request_refused"]
        .as_str()
        .unwrap_or_else(|| panic!("b admitted: {v}"));
    assert!(
        why.contains(UUID) && why.contains("8 GiB") && why.contains("10 GiB") && why.contains("16 GiB"),
        "{why}"
    );
    // Control: b asks 6 GiB: 10 + 6 fits the device exactly, both are admitted.
    set(&lim_b, &["--request", "6g"]);
    let v = pass();
    assert!(device(&v, "a")["memory_request_refused"].is_null(), "{v}");
    assert!(device(&v, "b")["memory_request_refused"].is_null(), "{v}");
    assert_eq!(device(&v, "b")["memory_request_bytes"], 6u64 << 30, "{v}");
    for r in &mut roots {
        let _ = r.kill();
        let _ = r.wait();
    }
}
