//! A container in its own pid namespace (a Kubernetes pod): NVML reports host pids, modelled by the
//! simulator's per-process `CUDASIM_HOST_PID_OFFSET`. The shim learns its host pid by diffing NVML's process
//! list around its first context creation, so overhead is measured (not estimated), the NVML process list
//! shows the container's own processes, and no process ever claims another's host pid.

use cuquota_core::region::SlotState;
use cuquota_core::UsageRegion;
use shim_tests::{parse_proc_list, Prog, Sim, GIB, MIB};

const OFFSET: u32 = 100_000;
const OTHER_OFFSET: u32 = 200_000;

/// Live slots of `pids` in the container's usage file: (pid, recorded host pid, bytes charged).
fn slots(sim: &Sim, pids: &[u32]) -> Vec<(u32, u32, u64)> {
    let usage = UsageRegion::open_existing(&sim.usage_file()).expect("usage file");
    usage
        .processes()
        .into_iter()
        .filter(|p| p.state == SlotState::Live && pids.contains(&p.pid))
        .map(|p| (p.pid, p.host_pid, p.mem_used.iter().sum()))
        .collect()
}

/// A 300m context (the shim's fallback estimate is 256m): free = 1g − 300m only if NVML's figure was found
/// under the host pid.
#[test]
fn overhead_is_measured_under_the_host_pid() {
    let sim = Sim::new().ctx_overhead("300m").build();
    let out = sim
        .cmd(Prog::Probe)
        .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
        .mem_limit("1g")
        .args("init info")
        .run();
    out.ok();
    assert_eq!(
        out.num("info.free"),
        GIB - 300 * MIB,
        "the 300m context must be measured, not estimated (256m):{out:?}"
    );
}

/// The NVML list through the shim shows the container's process under its host pid and hides another
/// container's (in another namespace).
#[test]
fn process_list_shows_own_host_pids_only() {
    let sim = Sim::new().build();
    let mut mine = sim
        .cmd(Prog::Probe)
        .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
        .mem_limit("1g")
        .args("init alloc:mem:128m wait")
        .spawn();
    // One at a time: two first contexts created at the same instant are ambiguous to the pid diff (that case
    // is `simultaneous_first_contexts_never_misattribute`); this test is about the list filter.
    mine.wait_ready(1);
    let mut theirs = sim
        .cmd(Prog::Probe)
        .container("other")
        .env("CUDASIM_HOST_PID_OFFSET", &OTHER_OFFSET.to_string())
        .mem_limit("1g")
        .args("init alloc:mem:64m wait")
        .spawn();
    theirs.wait_ready(1);
    let my_host = mine.pid() + OFFSET;
    let their_host = theirs.pid() + OTHER_OFFSET;

    // a node-side view (offset 0, no shim) lists both under their host pids
    let bare = sim.cmd(Prog::NvmlProbe).no_preload().args("procs:0").run();
    bare.ok();
    let all = parse_proc_list(bare.val("procs.0.v3"));
    assert!(
        all.iter().any(|p| p.0 == my_host) && all.iter().any(|p| p.0 == their_host),
        "the simulator should list both host pids:{bare:?}"
    );

    // nvidia-smi inside the pod
    let out = sim
        .cmd(Prog::NvmlProbe)
        .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
        .mem_limit("1g")
        .args("procs:0")
        .run();
    out.ok();
    for v in ["v1", "v2", "v3"] {
        let list = parse_proc_list(out.val(&format!("procs.0.{v}")));
        assert_eq!(
            list.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![my_host],
            "{v} must show exactly the container's process, by host pid:{out:?}"
        );
        assert!(list[0].1 >= 128 * MIB, "{v}:{out:?}");
    }
    assert_eq!(
        slots(&sim, &[mine.pid(), theirs.pid()]),
        vec![(mine.pid(), my_host, 128 * MIB)],
        "the slot records the host pid (and the measured 0-byte context of this sim, not the 256m estimate)"
    );
    mine.finish().ok();
    theirs.finish().ok();
}

/// Two processes of one container create their first contexts at the same moment: each either learns its
/// own host pid or (ambiguous diff) stays unknown and is estimated — never another's pid or charge. A later
/// process on its own learns its pid.
#[test]
fn simultaneous_first_contexts_never_misattribute() {
    let sim = Sim::new().ctx_overhead("300m").build();
    for round in 0..3 {
        let mut procs: Vec<_> = (0..2)
            .map(|_| {
                sim.cmd(Prog::Probe)
                    .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
                    .mem_limit("4g")
                    .args("wait init wait module wait")
                    .spawn()
            })
            .collect();
        for p in procs.iter_mut() {
            p.wait_ready(1);
        }
        for p in procs.iter_mut() {
            p.release();
        }
        for p in procs.iter_mut() {
            p.wait_ready(2);
        }
        for p in procs.iter_mut() {
            p.release();
        }
        for p in procs.iter_mut() {
            p.wait_ready(3);
        }
        let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
        let live = slots(&sim, &pids);
        assert_eq!(live.len(), 2, "round {round}: {live:?}");
        for (pid, host, used) in &live {
            if *host == 0 {
                // unknown: the estimate (256m context + 2m module)
                assert_eq!(*used, 258 * MIB, "round {round}: pid {pid} {live:?}");
            } else {
                assert_eq!(
                    *host,
                    pid + OFFSET,
                    "round {round}: pid {pid} claims another's host pid"
                );
                assert_eq!(*used, 302 * MIB, "round {round}: pid {pid} measured {live:?}");
            }
        }
        for p in procs {
            p.finish().ok();
        }
    }
    let mut alone = sim
        .cmd(Prog::Probe)
        .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
        .mem_limit("4g")
        .args("init wait")
        .spawn();
    alone.wait_ready(1);
    let pid = alone.pid();
    assert_eq!(slots(&sim, &[pid]), vec![(pid, pid + OFFSET, 300 * MIB)]);
    alone.finish().ok();
}
