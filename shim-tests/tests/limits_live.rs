//! The agent's limits file: a live change is obeyed by the next allocation, and nothing in a process's own
//! environment can raise what the agent wrote.

use shim_tests::{Prog, Sim, GIB, MIB};

#[test]
fn live_limit_change_applies_to_the_next_allocation() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "2g");
    let mut p = sim
        .cmd(Prog::Probe)
        .args("init totalmem alloc:mem:512m wait alloc:mem:512m wait alloc:mem:512m info")
        .spawn();
    p.wait_ready(1);
    assert_eq!(p.wait_for("alloc.0"), "CUDA_SUCCESS");
    assert_eq!(p.wait_for("totalmem"), (2 * GIB).to_string());
    // lower it under the process's feet (with the agent's CLI): 512m held + 512m > 768m
    sim.cli_memory_limit(0, "768m");
    p.release();
    p.wait_ready(2);
    assert_eq!(
        p.wait_for("alloc.1"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "the lowered limit was not obeyed"
    );
    // raise it again (with core's LimitsWriter)
    sim.agent_memory_limit(0, "1g");
    p.release();
    let out = p.finish();
    out.ok();
    assert_eq!(
        out.val("alloc.2"),
        "CUDA_SUCCESS",
        "the raised limit was not obeyed:{out:?}"
    );
    assert_eq!(out.num("info.total"), GIB, "{out:?}");
    assert_eq!(out.num("info.free"), 0, "{out:?}");
}

#[test]
fn env_cannot_exceed_the_agent_limit() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    for env in ["4g", "0"] {
        let out = sim
            .cmd(Prog::Probe)
            .mem_limit(env)
            .args("init totalmem info fill:mem:256m")
            .run();
        out.ok();
        assert_eq!(
            out.num("totalmem"),
            GIB,
            "env {env} raised the agent's 1g:{out:?}"
        );
        assert_eq!(out.num("info.total"), GIB, "env {env}:{out:?}");
        assert_eq!(
            out.num("fill.count"),
            4,
            "env {env} let the process past the agent's 1g:{out:?}"
        );
    }
    // a lower env limit still applies
    let out = sim.cmd(Prog::Probe).mem_limit("512m").args("init totalmem").run();
    out.ok();
    assert_eq!(out.num("totalmem"), 512 * MIB, "{out:?}");
}

#[test]
fn env_cannot_raise_the_weight_past_an_agent_file_that_sets_none() {
    // The agent's file caps memory and leaves the burst weight at the default (100): the process's own
    // CUQUOTA_WEIGHT=1000 must not take ten times the spare time; a lower weight is its own to take.
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    for (asked, want) in [("1000", 100), ("20", 20)] {
        let out = sim
            .cmd(Prog::Probe)
            .env("CUQUOTA_WEIGHT", asked)
            .args("init totalmem")
            .run();
        out.ok();
        assert_eq!(out.num("totalmem"), GIB, "{out:?}");
        let usage = cuquota_core::UsageRegion::open_existing(&sim.usage_file()).expect("usage file");
        let d = usage.devices();
        assert_eq!(
            d.first().map(|d| d.limits.weight_or_default()),
            Some(want),
            "CUQUOTA_WEIGHT={asked} under the agent's file: the process enforces {d:?}"
        );
    }
}
