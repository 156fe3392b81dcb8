//! `cuquota demo` end to end on the simulated GPU: three tenants, their caps and SM limits held, the limit
//! raised live halfway, memory refused at the cap; the report matches its schema; the default run takes less
//! than a minute. Nothing is installed (`--offline`): the samples need the toolchain the setup step put in .deps/.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use shim_tests::{check_schema, cli_bin, Output, Sim};

/// The demos measure shares of wall time: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn demo(sim: &Sim, args: &[&str]) -> Output {
    // The demo sets up its own simulated GPU (--sim), as on a machine without a driver.
    let mut c = sim
        .cmd_path(cli_bin())
        .no_preload()
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CUDASIM_STATE")
        .env_remove("CUQUOTA_USAGE_FILE")
        .env_remove("CUDASIM_CTX_OVERHEAD") // the simulator's default (256 MiB), as on a fresh machine
        .env_remove("CUDASIM_DEVICES")
        .env_remove("CUDASIM_MEMORY")
        .timeout(Duration::from_secs(300))
        .args("demo --sim --offline");
    for a in args {
        c = c.arg(a);
    }
    c.run()
}

fn tenant<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tenant {name}: {v}"))
}

/// The default demo with the CUDA samples, as the README runs it (JSON here): under a minute, every tenant OK.
#[test]
fn demo_with_the_cuda_samples() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let readme = std::fs::read_to_string(shim_tests::workspace_root().join("README.md")).unwrap();
    assert!(
        readme.contains("cargo run --release -p cuquota-cli -- demo"),
        "the README leads with the demo"
    );
    let sim = Sim::new().build();
    let t0 = Instant::now();
    let out = demo(&sim, &["--workload", "samples", "--json"]);
    let wall = t0.elapsed();
    assert!(out.success(), "{out:?}");
    let v = check_schema("demo.v1.json", &out.lines.join("\n"));
    assert_eq!(v["workload"], "samples", "{v}");
    assert_eq!(v["duration_ms"], 20_000, "the default length:{v}");
    let run_ms = v["wall_ms"].as_u64().unwrap() - v["setup_ms"].as_u64().unwrap();
    assert!(
        run_ms < 60_000,
        "the demo takes {run_ms} ms after setup (wall {wall:?}):{v}"
    );
    for t in v["tenants"].as_array().unwrap() {
        assert_eq!(t["ok"], true, "{t}");
    }
    let serve = tenant(&v, "serve");
    let (a, b) = (
        serve["share_first_half_percent"].as_f64().unwrap(),
        serve["share_second_half_percent"].as_f64().unwrap(),
    );
    assert!(
        (10.0..=25.0).contains(&a) && (30.0..=45.0).contains(&b),
        "serve 20 % then 40 %: {a} → {b}"
    );
    let nb = tenant(&v, "notebook");
    assert_eq!(nb["memory_seen_total_bytes"], 1u64 << 30, "{nb}");
    let refused = nb["memory_refused_at_bytes"].as_object().unwrap();
    assert_eq!(refused.len(), 9, "every API of oom_probe:{nb}");
    for (api, at) in refused {
        assert_eq!(
            at,
            768u64 << 20,
            "{api}: refused once 768 MiB + the 256 MiB context filled the 1 GiB cap:{nb}"
        );
    }
    // Progress went to stderr (stdout is the JSON).
    assert!(out.stderr.contains("SM limit raised 20% → 40% live"), "{out:?}");
}

/// With the C probe programs: the table and the verdicts a person reads.
#[test]
fn demo_with_the_probe_programs_prints_the_table() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Sim::new().build();
    let out = demo(&sim, &["--workload", "probes", "--duration", "6s"]);
    assert!(out.success(), "{out:?}");
    let text = out.lines.join("\n");
    assert!(
        text.contains("they run the C probe programs of the tests"),
        "says which ran:\n{text}"
    );
    assert!(
        text.contains("TENANT") && text.contains("20% → 40% hard") && text.contains("at 768 MiB"),
        "{text}"
    );
    for name in ["train", "serve", "notebook"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("OK   {name}"))),
            "{name} not OK:\n{text}"
        );
    }
    let out = demo(&sim, &["--workload", "probes", "--duration", "1s"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "too short to measure: a usage error:{out:?}"
    );
}

/// The demo can fail: with a preload that enforces nothing (the simulator itself in cuquota's place) the
/// tenants do not get what they asked for, and the demo says so with exit status 1.
#[test]
fn demo_fails_when_nothing_enforces_the_limits() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Sim::new().build();
    let lib = shim_tests::sim_lib();
    let out = demo(
        &sim,
        &[
            "--workload",
            "probes",
            "--duration",
            "4s",
            "--json",
            "--library",
            lib.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v = check_schema("demo.v1.json", &out.lines.join("\n"));
    // serve (20 %, then 40 %) gets half the GPU, notebook the whole of it (train, at 50 %, may look held).
    for name in ["serve", "notebook"] {
        assert_eq!(tenant(&v, name)["ok"], false, "{v}");
    }
    assert_eq!(
        tenant(&v, "notebook")["memory_seen_total_bytes"],
        16u64 << 30,
        "the whole GPU:{v}"
    );
}
