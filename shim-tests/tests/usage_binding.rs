//! Class 7 of issue 11 (part): the agent's limits file binds the container's usage file, so a process started
//! with `CUQUOTA_USAGE_FILE` pointing at a private file does not get a private cap. Four processes, each with
//! its own usage file, under an agent file with a 1 GiB cap that names the container's usage file: together
//! they stay within 1 GiB by the simulator's own count.

use shim_tests::{Prog, Sim, GIB};

#[test]
fn private_usage_files_do_not_multiply_the_agent_cap() {
    let sim = Sim::new().ctx_overhead("64m").build();
    sim.agent_memory_limit(0, "1g");
    let file = sim.limits_file();
    let usage = sim.usage_file();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "0",
        "--usage",
        usage.to_str().unwrap(),
    ]);
    assert!(out.success(), "binding the usage file failed:{out:?}");

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
