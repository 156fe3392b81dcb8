//! Processes of one container share one cap: the sum never exceeds it, exactly floor((cap − overhead) /
//! chunk) chunks succeed in total, and a SIGKILLed process's share comes back.

use shim_tests::{Prog, Sim, GIB, MIB};

fn share(n: u64, ctx_mib: u64, chunk_mib: u64) {
    let sim = Sim::new().ctx_overhead(&format!("{ctx_mib}m")).build();
    let mut procs: Vec<_> = (0..n)
        .map(|_| {
            sim.cmd(Prog::Probe)
                .mem_limit("1g")
                .args(&format!("init wait fill:mem:{chunk_mib}m wait"))
                .timeout(std::time::Duration::from_secs(60))
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
    // everyone is full: the driver holds no more than the cap
    let raw = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    raw.ok();
    assert!(
        raw.num("sim.used.0") <= GIB,
        "{n} processes hold more than the 1g cap:{raw:?}"
    );
    let mut total = 0;
    for p in procs {
        let o = p.finish();
        o.ok().expect("fill.rc", "CUDA_ERROR_OUT_OF_MEMORY");
        total += o.num("fill.count");
    }
    let expected = (1024 - n * ctx_mib) / chunk_mib;
    assert_eq!(
        total, expected,
        "{n} processes, {ctx_mib}m contexts, {chunk_mib}m chunks, 1g cap"
    );
}

#[test]
fn two_processes_share_one_cap() {
    share(2, 64, 32);
}

#[test]
fn eight_processes_share_one_cap() {
    share(8, 64, 32);
}

#[test]
fn eight_processes_without_overhead() {
    share(8, 0, 48);
}

/// A process holding memory is SIGKILLed; the others get its share.
#[test]
fn killed_process_memory_returns() {
    let sim = Sim::new().build();
    let mut victim = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:768m wait")
        .spawn();
    victim.wait_ready(1);
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:512m")
        .run();
    out.ok().expect("alloc.0", "CUDA_ERROR_OUT_OF_MEMORY");
    let killed = victim.kill();
    assert!(!killed.success(), "the victim should have died:{killed:?}");
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:512m info")
        .run();
    out.ok();
    assert_eq!(
        out.val("alloc.0"),
        "CUDA_SUCCESS",
        "the killed process's 768m was not returned:{out:?}"
    );
    assert_eq!(out.num("info.free"), GIB - 512 * MIB, "{out:?}");
}
