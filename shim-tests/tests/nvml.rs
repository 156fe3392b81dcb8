//! NVML under the shim: memory info shows the cap and the container's usage (bare and _v2 agree), and the
//! process lists (bare, _v2, _v3) show only the container's own processes.

use cuquota_core::UsageRegion;
use shim_tests::{parse_proc_list, Proc, Prog, Sim, GIB, MIB};

#[test]
fn memory_info_shows_cap_and_container_usage() {
    let sim = Sim::new().memory("16g").build();
    let mut holder = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:256m wait")
        .spawn();
    holder.wait_ready(1);
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args("count mem:0").run();
    out.ok();
    assert_eq!(
        out.num("mem.0.total"),
        GIB,
        "nvmlDeviceGetMemoryInfo total must be the cap:{out:?}"
    );
    assert_eq!(out.num("mem.0.used"), 256 * MIB, "{out:?}");
    assert_eq!(out.num("mem.0.free"), GIB - 256 * MIB, "{out:?}");
    assert_eq!(out.val("mem.0.v2.rc"), "0", "{out:?}");
    assert_eq!(
        out.num("mem.0.v2.total"),
        out.num("mem.0.total"),
        "v1 and v2 disagree:{out:?}"
    );
    assert_eq!(
        out.num("mem.0.v2.used") + out.num("mem.0.v2.reserved"),
        out.num("mem.0.used"),
        "v2 used+reserved must equal v1 used:{out:?}"
    );
    assert_eq!(
        out.num("mem.0.v2.free"),
        out.num("mem.0.free"),
        "v1 and v2 disagree:{out:?}"
    );
    holder.finish().ok();
}

/// A process of this container holding 128 MiB and one of container `other` holding 64 MiB, both ready and
/// waiting (release them with `finish`).
fn two_containers(sim: &Sim) -> (Proc, Proc) {
    let mut mine = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:128m wait")
        .spawn();
    let mut theirs = sim
        .cmd(Prog::Probe)
        .container("other")
        .mem_limit("1g")
        .args("init alloc:mem:64m wait")
        .spawn();
    mine.wait_ready(1);
    theirs.wait_ready(1);
    (mine, theirs)
}

/// Two containers on one GPU: each sees only its own processes, through every version of the call.
#[test]
fn running_processes_hide_other_containers() {
    let sim = Sim::new().build();
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());

    // sanity: the simulator itself lists both
    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args("procs:0").run();
    bare.ok();
    let all = parse_proc_list(bare.val("procs.0.v3"));
    assert!(
        all.iter().any(|p| p.0 == my_pid) && all.iter().any(|p| p.0 == their_pid),
        "the simulator should list both processes:{bare:?}"
    );

    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args("procs:0").run();
    out.ok();
    for v in ["v1", "v2", "v3"] {
        assert_eq!(out.val(&format!("procs.0.{v}.rc")), "0", "{v}:{out:?}");
        let list = parse_proc_list(out.val(&format!("procs.0.{v}")));
        assert!(
            !list.iter().any(|p| p.0 == their_pid),
            "{v} shows another container's process:{out:?}"
        );
        let me = list.iter().find(|p| p.0 == my_pid);
        assert!(
            me.is_some(),
            "{v} does not show the container's own process {my_pid}:{out:?}"
        );
        assert!(me.unwrap().1 >= 128 * MIB, "{v}: usedGpuMemory too small:{out:?}");
        assert_eq!(
            out.num(&format!("procs.0.{v}.count")),
            list.len() as u64,
            "{v}:{out:?}"
        );
    }
    assert_eq!(
        out.num("procs.0.query.count"),
        1,
        "a size query must count only the container's:{out:?}"
    );

    // and the other container sees only its own
    let out = sim
        .cmd(Prog::NvmlProbe)
        .container("other")
        .mem_limit("1g")
        .args("procs:0")
        .run();
    out.ok();
    let list = parse_proc_list(out.val("procs.0.v3"));
    assert_eq!(
        list.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![their_pid],
        "{out:?}"
    );
    mine.finish().ok();
    theirs.finish().ok();
}

#[test]
fn nvml_without_limit_passes_through() {
    let sim = Sim::new().memory("8g").build();
    let out = sim.cmd(Prog::NvmlProbe).args("count mem:0").run();
    out.ok();
    assert_eq!(out.num("count"), 1, "{out:?}");
    assert_eq!(out.num("mem.0.total"), 8 * GIB, "{out:?}");
}

/// Class 5 of issue 11: a tenant that writes another container's pid into its own (writable) usage file sees
/// that process in NVML's lists under the cooperative fallback; once the agent publishes the container's
/// members in its read-only limits file, the usage file's pids no longer count.
#[test]
fn agent_membership_ignores_pids_a_tenant_writes_into_the_usage_file() {
    use cuquota_core::region::LimitsWriter;
    let sim = Sim::new()
        .env("CUDASIM_NVML_LISTS", "compute,graphics,mps,accounting")
        .build();
    let agent = LimitsWriter::create(&sim.limits_file()).expect("limits file");
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());

    // The forgery: a live process of this container (this test) records the other container's pid as its
    // NVML pid in the container's usage file.
    let usage = UsageRegion::open(&sim.usage_file()).expect("usage file");
    let slot = usage.process_slot().expect("a slot");
    usage.set_host_pid(slot, their_pid);

    let pids = |out: &shim_tests::Output| -> Vec<u32> {
        parse_proc_list(out.val("procs.0.v3"))
            .iter()
            .map(|p| p.0)
            .collect()
    };
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args("procs:0").run();
    out.ok();
    assert!(
        pids(&out).contains(&their_pid),
        "the cooperative fallback was expected to be fooled by the forged pid (else this test attacks nothing):{out:?}"
    );

    agent.set_members(&[my_pid]).expect("publish members");
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args("procs:0").run();
    out.ok();
    let list = pids(&out);
    assert!(
        !list.contains(&their_pid),
        "with agent membership, a pid forged into the usage file still shows another container's process:{out:?}"
    );
    assert!(list.contains(&my_pid), "the member {my_pid} is missing:{out:?}");
    for v in ["v1", "v2"] {
        let l: Vec<u32> = parse_proc_list(out.val(&format!("procs.0.{v}")))
            .iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(l, list, "{v} differs from v3:{out:?}");
    }
    // every other per-process call goes through the same membership
    let args = format!(
        "gprocs:0 mprocs:0 detail:0:0 detail:0:1 detail:0:2 acct:0 acctstat:0:{their_pid} pname:{their_pid}"
    );
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args(&args).run();
    out.ok();
    for key in [
        "gprocs.0.v3",
        "mprocs.0.v3",
        "detail.0.0",
        "detail.0.1",
        "detail.0.2",
        "acct.0",
    ] {
        let l: Vec<u32> = parse_proc_list(out.val(key)).iter().map(|p| p.0).collect();
        assert!(
            !l.contains(&their_pid) && l.contains(&my_pid),
            "{key} with agent membership:{out:?}"
        );
    }
    assert_eq!(out.val(&format!("acctstat.0.{their_pid}.rc")), "6", "{out:?}");
    assert_eq!(out.val(&format!("pname.{their_pid}.rc")), "6", "{out:?}");

    usage.release_process_slot();
    mine.finish().ok();
    theirs.finish().ok();
}

/// Class 5 of issue 11: per-process utilisation (`nvmlDeviceGetProcessUtilization`) shows only the
/// container's processes. Two containers launch 5 ms kernels on one GPU (not CPU-heavy); each sees its own.
#[test]
fn process_utilization_hides_other_containers() {
    utilization_hides_other_containers("putil");
}

/// Class 5 of issue 11: the same through `nvmlDeviceGetProcessesUtilizationInfo` (the versioned struct): the
/// size query (NULL array) counts only the container's samples.
#[test]
fn processes_utilization_info_hides_other_containers() {
    utilization_hides_other_containers("putil2");
}

/// Two containers busy on one GPU; nvml_probe's `<what>:0` under the shim lists only the container's own.
fn utilization_hides_other_containers(what: &str) {
    use shim_tests::throttle_paths_dl;
    let launcher = throttle_paths_dl();
    let sim = Sim::new().build();
    let launch = |container: &str| {
        sim.cmd_path(launcher.clone())
            .container(container)
            .mem_limit("1g")
            .timeout(std::time::Duration::from_secs(60))
            .args("kernel dlsym 4 5000000 1 0")
            .spawn()
    };
    let mine = launch("default");
    let theirs = launch("other");
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());
    let (cmd, key) = (format!("{what}:0"), format!("{what}.0"));
    let busy = |out: &shim_tests::Output| -> Vec<u32> {
        parse_proc_list(out.val(&key)).iter().map(|p| p.0).collect()
    };
    // Both have launched within the last second once the simulator's own NVML lists both (bounded wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let bare = sim.cmd(Prog::NvmlProbe).no_preload().args(&cmd).run();
        bare.ok();
        let all = busy(&bare);
        if all.contains(&my_pid) && all.contains(&their_pid) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the simulator never showed both launchers busy:{bare:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args(&cmd).run();
    out.ok();
    assert_eq!(out.val(&format!("{key}.rc")), "0", "{out:?}");
    let list = busy(&out);
    assert!(
        !list.contains(&their_pid),
        "process utilisation shows another container's process:{out:?}"
    );
    assert!(
        list.contains(&my_pid),
        "the container's own process {my_pid} is missing:{out:?}"
    );
    assert_eq!(out.num(&format!("{key}.count")), list.len() as u64, "{out:?}");
    if what == "putil2" {
        assert_eq!(
            out.num(&format!("{key}.query.count")),
            list.len() as u64,
            "a size query must count only the container's:{out:?}"
        );
    }
    assert!(mine.finish().success());
    assert!(theirs.finish().success());
}

/// Class 5 of issue 11: the graphics and MPS process lists (bare, `_v2`, `_v3`) show only the container's
/// processes, and their size protocol counts only those. The simulator lists its processes there too
/// (`CUDASIM_NVML_LISTS`), as a real GPU lists a process with a graphics context or an MPS client.
#[test]
fn graphics_and_mps_lists_hide_other_containers() {
    let sim = Sim::new()
        .env("CUDASIM_NVML_LISTS", "compute,graphics,mps")
        .build();
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());
    let pids = |out: &shim_tests::Output, key: &str| -> Vec<u32> {
        parse_proc_list(out.val(key)).iter().map(|p| p.0).collect()
    };

    // ground truth: the simulator itself lists both in each list
    let bare = sim
        .cmd(Prog::NvmlProbe)
        .no_preload()
        .args("gprocs:0 mprocs:0")
        .run();
    bare.ok();
    for what in ["gprocs", "mprocs"] {
        let all = pids(&bare, &format!("{what}.0.v3"));
        assert!(
            all.contains(&my_pid) && all.contains(&their_pid),
            "the simulator should list both processes in {what}:{bare:?}"
        );
    }

    let out = sim
        .cmd(Prog::NvmlProbe)
        .mem_limit("1g")
        .args("gprocs:0 mprocs:0")
        .run();
    out.ok();
    for what in ["gprocs", "mprocs"] {
        for v in ["v1", "v2", "v3"] {
            let key = format!("{what}.0.{v}");
            assert_eq!(out.val(&format!("{key}.rc")), "0", "{key}:{out:?}");
            let list = parse_proc_list(out.val(&key));
            assert!(
                !list.iter().any(|p| p.0 == their_pid),
                "{key} shows another container's process:{out:?}"
            );
            let me = list.iter().find(|p| p.0 == my_pid);
            assert!(me.is_some(), "{key} hides the container's own process:{out:?}");
            assert!(
                me.unwrap().1 >= 128 * MIB,
                "{key}: usedGpuMemory too small:{out:?}"
            );
            assert_eq!(
                out.num(&format!("{key}.count")),
                list.len() as u64,
                "{key}:{out:?}"
            );
        }
        assert_eq!(
            out.num(&format!("{what}.0.query.count")),
            1,
            "{what}: a size query must count only the container's:{out:?}"
        );
        // a buffer one short of the size query's answer: INSUFFICIENT_SIZE (7) and the same count
        assert_eq!(out.val(&format!("{what}.0.short.rc")), "7", "{what}:{out:?}");
        assert_eq!(out.num(&format!("{what}.0.short.count")), 1, "{what}:{out:?}");
    }
    mine.finish().ok();
    theirs.finish().ok();
}

/// Class 5 of issue 11: accounting (`nvmlDeviceGetAccountingPids`, `nvmlDeviceGetAccountingStats`) shows only
/// the container's processes: another container's pid is missing from the list and its stats answer
/// NOT_FOUND (6), as for a pid NVML does not know. The simulator turns accounting mode on by
/// `CUDASIM_NVML_LISTS=accounting`. `nvmlSystemGetProcessName` of another container's pid answers
/// NOT_FOUND too.
#[test]
fn accounting_hides_other_containers() {
    let sim = Sim::new().env("CUDASIM_NVML_LISTS", "compute,accounting").build();
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());
    let args = format!("acct:0 acctstat:0:{my_pid} acctstat:0:{their_pid}");
    let pids = |out: &shim_tests::Output| -> Vec<u32> {
        parse_proc_list(out.val("acct.0")).iter().map(|p| p.0).collect()
    };

    // ground truth: the simulator itself accounts for both
    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args(&args).run();
    bare.ok();
    assert_eq!(bare.val("acct.0.mode"), "1", "accounting mode:{bare:?}");
    let all = pids(&bare);
    assert!(
        all.contains(&my_pid) && all.contains(&their_pid),
        "the simulator should account for both processes:{bare:?}"
    );
    assert_eq!(bare.val(&format!("acctstat.0.{their_pid}.rc")), "0", "{bare:?}");
    assert!(
        bare.num(&format!("acctstat.0.{their_pid}.mem")) >= 64 * MIB,
        "{bare:?}"
    );

    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args(&args).run();
    out.ok();
    assert_eq!(out.val("acct.0.rc"), "0", "{out:?}");
    let list = pids(&out);
    assert!(
        !list.contains(&their_pid),
        "accounting pids show another container's process:{out:?}"
    );
    assert!(
        list.contains(&my_pid),
        "the container's own pid is missing:{out:?}"
    );
    assert_eq!(out.num("acct.0.count"), list.len() as u64, "{out:?}");
    assert_eq!(out.val("acct.0.query.rc"), "7", "size query:{out:?}");
    assert_eq!(
        out.num("acct.0.query.count"),
        list.len() as u64,
        "a size query must count only the container's:{out:?}"
    );
    assert_eq!(
        out.val(&format!("acctstat.0.{their_pid}.rc")),
        "6",
        "another container's accounting stats must answer NOT_FOUND:{out:?}"
    );
    assert_eq!(out.num(&format!("acctstat.0.{their_pid}.mem")), 0, "{out:?}");
    assert_eq!(out.val(&format!("acctstat.0.{my_pid}.rc")), "0", "{out:?}");
    assert!(
        out.num(&format!("acctstat.0.{my_pid}.mem")) >= 128 * MIB,
        "{out:?}"
    );
    assert_eq!(out.num(&format!("acctstat.0.{my_pid}.running")), 1, "{out:?}");

    // nvmlSystemGetProcessName: the simulator names both; under the shim another container's pid is unknown
    let args = format!("pname:{my_pid} pname:{their_pid}");
    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args(&args).run();
    bare.ok();
    assert_eq!(bare.val(&format!("pname.{their_pid}.rc")), "0", "{bare:?}");
    assert!(
        bare.val(&format!("pname.{their_pid}")).contains("probe"),
        "{bare:?}"
    );
    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args(&args).run();
    out.ok();
    assert_eq!(
        out.val(&format!("pname.{their_pid}.rc")),
        "6",
        "another container's process name must answer NOT_FOUND:{out:?}"
    );
    assert_eq!(out.val(&format!("pname.{their_pid}")), "", "{out:?}");
    assert_eq!(out.val(&format!("pname.{my_pid}.rc")), "0", "{out:?}");
    assert!(out.val(&format!("pname.{my_pid}")).contains("probe"), "{out:?}");
    mine.finish().ok();
    theirs.finish().ok();
}

/// Class 5 of issue 11: `nvmlDeviceGetRunningProcessDetailList` in each mode (compute, graphics, MPS) shows
/// only the container's processes, and its size query (0 + NULL) counts only those.
#[test]
fn process_detail_list_hides_other_containers() {
    let sim = Sim::new()
        .env("CUDASIM_NVML_LISTS", "compute,graphics,mps")
        .build();
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());
    let args = "detail:0:0 detail:0:1 detail:0:2";

    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args(args).run();
    bare.ok();
    for mode in 0..3 {
        let all: Vec<u32> = parse_proc_list(bare.val(&format!("detail.0.{mode}")))
            .iter()
            .map(|p| p.0)
            .collect();
        assert!(
            all.contains(&my_pid) && all.contains(&their_pid),
            "the simulator should list both processes in mode {mode}:{bare:?}"
        );
    }

    let out = sim.cmd(Prog::NvmlProbe).mem_limit("1g").args(args).run();
    out.ok();
    for mode in 0..3 {
        let key = format!("detail.0.{mode}");
        assert_eq!(out.val(&format!("{key}.rc")), "0", "{key}:{out:?}");
        let list = parse_proc_list(out.val(&key));
        assert!(
            !list.iter().any(|p| p.0 == their_pid),
            "{key} shows another container's process:{out:?}"
        );
        let me = list.iter().find(|p| p.0 == my_pid);
        assert!(me.is_some(), "{key} hides the container's own process:{out:?}");
        assert!(
            me.unwrap().1 >= 128 * MIB,
            "{key}: usedGpuMemory too small:{out:?}"
        );
        assert_eq!(
            out.num(&format!("{key}.count")),
            list.len() as u64,
            "{key}:{out:?}"
        );
        assert_eq!(out.val(&format!("{key}.query.rc")), "7", "{key}:{out:?}");
        assert_eq!(
            out.num(&format!("{key}.query.count")),
            list.len() as u64,
            "{key}: a size query must count only the container's:{out:?}"
        );
    }
    mine.finish().ok();
    theirs.finish().ok();
}

/// Issue 21, item 9: `nvmlDeviceGetEncoderSessions` and `nvmlDeviceGetFBCSessions` show only the container's
/// sessions (another container's pid is missing from the list, from the size query's count too); the
/// simulator gives every process on the device one session of each (`CUDASIM_NVML_LISTS=encoder,fbc`). The
/// vGPU host's per-process calls answer NOT_SUPPORTED (3) and clearing accounting NO_PERMISSION (4).
#[test]
fn encoder_and_fbc_sessions_hide_other_containers() {
    let sim = Sim::new()
        .env("CUDASIM_NVML_LISTS", "compute,encoder,fbc")
        .build();
    let (mine, theirs) = two_containers(&sim);
    let (my_pid, their_pid) = (mine.pid(), theirs.pid());
    let pids = |out: &shim_tests::Output, key: &str| -> Vec<u32> {
        parse_proc_list(out.val(key)).iter().map(|p| p.0).collect()
    };

    // ground truth: the simulator itself lists both processes' sessions
    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args("enc:0 fbc:0").run();
    bare.ok();
    for what in ["enc", "fbc"] {
        let all = pids(&bare, &format!("{what}.0"));
        assert!(
            all.contains(&my_pid) && all.contains(&their_pid),
            "the simulator should list both processes' {what} sessions:{bare:?}"
        );
        assert_eq!(
            bare.num(&format!("{what}.0.query.count")),
            all.len() as u64,
            "{bare:?}"
        );
    }

    let out = sim
        .cmd(Prog::NvmlProbe)
        .mem_limit("1g")
        .args("enc:0 fbc:0 vgpu:0")
        .run();
    out.ok();
    for what in ["enc", "fbc"] {
        assert_eq!(out.val(&format!("{what}.0.rc")), "0", "{what}:{out:?}");
        let list = pids(&out, &format!("{what}.0"));
        assert!(
            !list.contains(&their_pid),
            "{what} sessions show another container's process:{out:?}"
        );
        assert!(
            list.contains(&my_pid),
            "{what}: the container's own session is missing:{out:?}"
        );
        assert_eq!(
            out.num(&format!("{what}.0.count")),
            list.len() as u64,
            "{what}:{out:?}"
        );
        assert_eq!(
            out.val(&format!("{what}.0.query.rc")),
            "0",
            "{what} size query:{out:?}"
        );
        assert_eq!(
            out.num(&format!("{what}.0.query.count")),
            list.len() as u64,
            "{what}: a size query must count only the container's:{out:?}"
        );
    }
    for (name, rc) in [
        ("nvmlVgpuInstanceGetEncoderSessions", "3"),
        ("nvmlVgpuInstanceGetFBCSessions", "3"),
        ("nvmlVgpuInstanceGetAccountingPids", "3"),
        ("nvmlVgpuInstanceGetAccountingStats", "3"),
        ("nvmlDeviceGetVgpuProcessUtilization", "3"),
        ("nvmlDeviceGetVgpuProcessesUtilizationInfo", "3"),
        ("nvmlDeviceClearAccountingPids", "4"),
        ("nvmlVgpuInstanceClearAccountingPids", "4"),
    ] {
        assert_eq!(out.val(&format!("vgpu.{name}.rc")), rc, "{name}:{out:?}");
    }
    mine.finish().ok();
    theirs.finish().ok();
}

/// The malformed and unfilterable forms of the per-process calls are answered by the shim, never forwarded:
/// a NULL buffer with a non-zero count (the real function writes the device-wide count, which tells a
/// container how many processes of others hold sessions) gets NVML_ERROR_INVALID_ARGUMENT (2); a struct
/// version the shim cannot filter NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25); nvmlDeviceSetAccountingMode
/// (disabling erases every process's records) NVML_ERROR_NO_PERMISSION (4).
#[test]
fn malformed_and_unfilterable_calls_are_not_forwarded() {
    let sim = Sim::new()
        .env("CUDASIM_NVML_LISTS", "compute,encoder,fbc,accounting")
        .build();
    let (mut mine, mut theirs) = two_containers(&sim);
    let prog = shim_tests::compile_c(
        "nvml_malformed",
        &shim_tests::workspace_root().join("shim-tests/c/nvml_malformed.c"),
        &[],
        &["-lnvidia-ml", "-ldl"],
    );
    // Control: the simulator itself answers a NULL buffer with the device-wide count.
    let bare = sim.cmd_path(prog.clone()).no_preload().run();
    let out = sim.cmd_path(prog).mem_limit("1g").run();
    mine.release();
    theirs.release();
    mine.finish();
    theirs.finish();
    assert!(
        bare.num("enc.count") >= 2,
        "the control must see both containers:{bare:?}"
    );
    for what in ["enc", "fbc", "procs", "acct"] {
        assert_eq!(out.val(&format!("{what}.rc")), "2", "{what}:{out:?}");
        assert_eq!(
            out.val(&format!("{what}.count")),
            "1",
            "{what}: count untouched:{out:?}"
        );
    }
    assert_eq!(out.val("detail_v2.rc"), "25", "{out:?}");
    assert_eq!(out.val("putil_v2.rc"), "25", "{out:?}");
    assert_eq!(out.val("setacct.rc"), "4", "{out:?}");
}
