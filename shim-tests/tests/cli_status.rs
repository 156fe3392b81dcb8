//! `cuquota status` against a live usage region: processes on the simulated GPU under a cap and an SM limit,
//! read while they run — memory charged, refusals at the cap, GPU share achieved, time throttled, NVML index.

use std::time::Duration;

use shim_tests::{check_schema, throttle_paths_direct, Prog, Sim, MIB};

const LIMITS: [(&str, &str); 3] = [
    ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
    ("CUDA_DEVICE_SM_LIMIT", "30"),
    ("CUQUOTA_POLICY", "hard"),
];

#[test]
fn status_of_a_live_container() {
    let sim = Sim::new().build();
    let mut holder = sim.cmd(Prog::Probe);
    for (k, v) in LIMITS {
        holder = holder.env(k, v);
    }
    let mut holder = holder.args("init pid alloc:mem:600m alloc:mem:600m wait").spawn();
    holder.wait_ready(1);
    let holder_pid: u32 = holder.wait_for("pid").parse().unwrap();

    // A launcher at a hard 30 % for 3 s, 1 ms kernels.
    let mut busy = sim
        .cmd_path(throttle_paths_direct())
        .timeout(Duration::from_secs(40));
    for (k, v) in LIMITS {
        busy = busy.env(k, v);
    }
    let busy = busy.args("kernel direct 3 1000000").spawn();
    std::thread::sleep(Duration::from_millis(800));

    let usage = sim.usage_file();
    let out = sim.cli(&[
        "status",
        "--usage",
        usage.to_str().unwrap(),
        "--json",
        "--interval",
        "1s",
    ]);
    assert!(out.success(), "{out:?}");
    let v = check_schema("status.v1.json", &out.lines.join("\n"));
    let d = &v["devices"][0];
    assert_eq!(d["index"], 0, "the NVML index of the device:{v}");
    let used = d["memory_used_bytes"].as_u64().unwrap();
    assert!(
        (600 * MIB..=610 * MIB).contains(&used),
        "the holder's 600 MiB and the launcher's module:{v}"
    );
    assert_eq!(d["memory_limit_bytes"], 1024 * MIB, "{v}");
    assert_eq!(d["sm_limit_percent"], 30, "{v}");
    assert_eq!(
        d["allocation_refusals"], 1,
        "the second 600 MiB was refused at the cap:{v}"
    );
    let share = d["share_percent"].as_f64().unwrap();
    assert!(
        (10.0..=45.0).contains(&share),
        "achieved share {share} under a 30 % limit:{v}"
    );
    assert!(
        d["throttled_ns"].as_u64().unwrap() > 100_000_000,
        "at 30 % the launcher waits most of the time:{v}"
    );
    let pids: Vec<u64> = d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(pids.contains(&u64::from(holder_pid)), "{v}");
    let holder_row = d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == holder_pid)
        .unwrap();
    assert_eq!(holder_row["memory_used_bytes"], 600 * MIB, "{v}");
    assert!(pids.contains(&u64::from(busy.pid())), "{v}");
    assert_eq!(v["live_processes"], 2, "{v}");

    // The table says the same.
    let out = sim.cli(&["status", "--usage", usage.to_str().unwrap(), "--interval", "0"]);
    let text = out.lines.join("\n");
    assert!(out.success(), "{out:?}");
    assert!(
        text.contains("1 GiB") && text.contains("600 MiB") && text.contains("30%"),
        "{text}"
    );
    assert!(text.contains(&format!("pid {holder_pid}")), "{text}");

    let busy = busy.finish();
    assert!(busy.success(), "{busy:?}");
    holder.release();
    assert!(holder.finish().success());
    // Both gone: their slots are reclaimed.
    let out = sim.cli(&[
        "status",
        "--usage",
        usage.to_str().unwrap(),
        "--json",
        "--interval",
        "0",
    ]);
    let v = check_schema("status.v1.json", &out.lines.join("\n"));
    assert_eq!(v["live_processes"], 0, "{v}");
    assert_eq!(v["devices"][0]["memory_used_bytes"], 0, "{v}");
}
