//! Rolling upgrades: a DaemonSet upgrade replaces the agent, the plugin and the library on the node while
//! files written by the previous version stay. The fixtures in core/tests/fixtures/upgrade-315d850/ were written
//! by commit 315d850's own writers (`cuquota limits`, `cuquota priority init`, its libcuquota.so for the usage
//! file; how: that folder's README.md); this version's library and CLI must read every one of them.

use std::path::PathBuf;

use shim_tests::{workspace_root, Prog, Sim};

fn fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("core/tests/fixtures/upgrade-315d850")
        .join(name)
}

fn mib(out: &shim_tests::Output, key: &str) -> u64 {
    out.get(key)
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
        .parse()
        .unwrap()
}

#[test]
fn the_library_enforces_an_old_agents_limits_file_with_an_old_usage_file() {
    let sim = Sim::new().memory("16g").build();
    // The old limits file: every GPU 1 GiB, 40 % hard, members 1,2,3 published; the old usage file: a record
    // of a process (gone now) holding 256 MiB.
    std::fs::copy(fixture("limits-unbound"), sim.limits_file()).unwrap();
    std::fs::copy(fixture("usage"), sim.usage_file()).unwrap();
    let out = sim.cmd(Prog::AllocProbe).arg("64m").run();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mib(&out, "meminfo_total_mib"), 1024, "{out:?}");
    let got = mib(&out, "allocated_mib");
    // The old record's owner is dead: its 256 MiB are reclaimed, not counted for ever.
    assert!(
        (896..=1024).contains(&got),
        "allocated {got} MiB under the old 1 GiB cap: {out:?}"
    );
}

#[test]
fn the_library_accepts_an_old_node_wide_priority_file() {
    let sim = Sim::new().memory("16g").build();
    let prio = sim.dir().join("priority");
    std::fs::copy(fixture("priority"), &prio).unwrap();
    // As pods mounted it then: the node's one file, no node directory beside it.
    for p in ["0", "1"] {
        let out = sim
            .cmd(Prog::AllocProbe)
            .arg("256m")
            .env("CUDA_TASK_PRIORITY", p)
            .env("CUQUOTA_PRIORITY_FILE", prio.to_str().unwrap())
            .mem_limit("2g")
            .run();
        assert!(out.status.success(), "priority {p} under the old file: {out:?}");
        assert_eq!(mib(&out, "meminfo_total_mib"), 2048, "{out:?}");
    }
    // Where a node directory is mounted, the file must be of this layout: a tenant cannot step out of its
    // peers by writing the old version into its own file.
    std::fs::create_dir(sim.dir().join("priority.d")).unwrap();
    let out = sim
        .cmd(Prog::AllocProbe)
        .arg("256m")
        .env("CUDA_TASK_PRIORITY", "1")
        .env("CUQUOTA_PRIORITY_FILE", prio.to_str().unwrap())
        .mem_limit("2g")
        .run();
    assert!(
        out.get("allocated_mib").is_none_or(|v| v == "0"),
        "an old-layout file beside a node directory was accepted: {out:?}"
    );
}

#[test]
fn the_cli_reads_an_old_limits_file() {
    let sim = Sim::new().build();
    let out = sim.cli(&["limits", "show", fixture("limits").to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.lines.join("\n")).unwrap();
    assert_eq!(v["members"], serde_json::json!([4242, 4343]));
    assert_eq!(v["usage_file"], "/var/run/cuquota/usage");
    assert_eq!(v["opt_out_allowed"], false);
    let e = &v["entries"];
    assert_eq!(e[0]["device"], "all");
    assert_eq!(e[0]["memory_limit_bytes"], 4u64 << 30);
    assert_eq!(e[0]["sm_limit_percent"], 30);
    assert_eq!(e[0]["policy"], "hard");
    assert_eq!(e[1]["uuid"], "GPU-0badc0de-0000-4000-8000-000000000001");
    assert_eq!(e[1]["memory_limit_bytes"], 2u64 << 30);
    assert_eq!(e[1]["policy"], "burst");
    assert_eq!(e[1]["weight"], 200);
    assert_eq!(e[1]["priority"], "low");
    assert_eq!(e[1]["reserved_memory_bytes"], 1u64 << 30);
}
