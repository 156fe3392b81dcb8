//! Hostile review of commit ca6432f: the per-process credit (src/memory/credit.rs, `Memory::admit`). Each test
//! states the guarantee the shim had before the commit; they FAIL on ca6432f (the point of a review test) and
//! pass on its parent. Judged by the simulator's own used bytes (its NVML past any interposer). Programs:
//! `c/credit_holder.c` and the probe. At most two simulated processes run at once (the others block on
//! stdin).

use shim_tests::credit::{holder_step, started};
use shim_tests::{Prog, Sim, GIB, MIB};
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// A process holds 32 MiB of credit (8 x 2 MiB, 1 MiB: a chunk charged ahead; the 8 x 2 MiB freed into it).
/// Another process of the container takes memory past the shim (the driver's own cuMemAlloc_v2) and fills:
/// near the cap the reconciliation charges what it took, and the ledger says the container is over its cap
/// (every admission charged against the sum is refused from here). The first process then asks for 1 MiB
/// pieces: before ca6432f each was charged against the sum and refused; with the credit, 32 are taken with no
/// look at the sum, and the simulator's used bytes, already past the cap, grow by 32 MiB more (per process
/// holding credit, per device).
#[test]
fn credit_is_taken_while_the_container_is_over_its_cap() {
    let sim = Sim::new().build();
    let holder = started(&sim, "hold 64");
    let bypass = started(&sim, "bypass 600m");
    let (over, after, h, b) = holder_step(&sim, holder, bypass);
    println!("holder:{h:?}\nbypass:{b:?}\nsim used: {over} with the bypass, {after} after the holder's asks");
    assert!(
        over > GIB,
        "the bypass did not take the container past its cap:{b:?}"
    );
    assert_eq!(
        h.num("taken"),
        0,
        "the container was {} MiB over its 1 GiB cap (the ledger knew: the bypass's fill was refused), yet a \
         process took {} MiB from its credit: the simulator went from {} to {} MiB",
        (over - GIB) / MIB,
        h.num("taken"),
        over / MIB,
        after / MIB
    );
}

/// `holders` processes each use small buffers then hold their credit; another fills the rest of the cap with
/// 1 MiB pieces. Before ca6432f it filled up to the cap; with the credit it is refused early by the other
/// processes' unused credit (up to 32 MiB each): judged by the simulator's used bytes when the filler is
/// refused.
fn false_oom(holders: usize) -> u64 {
    let sim = Sim::new().build();
    let mut procs: Vec<_> = (0..holders).map(|_| started(&sim, "hold 0")).collect();
    let filler = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init fill:mem:1m simused")
        .timeout(Duration::from_secs(60))
        .run();
    filler.ok();
    let used = filler.num("sim.used.0");
    for p in procs.iter_mut() {
        p.release();
        p.wait_ready(2);
        p.release();
    }
    for p in procs {
        p.finish();
    }
    let short = GIB.saturating_sub(used);
    println!(
        "{holders} holders: the filler was refused at {} MiB of the 1 GiB cap ({} MiB short)",
        used / MIB,
        short / MIB
    );
    short
}

#[test]
fn idle_credit_of_other_processes_refuses_a_filler_early() {
    let one = false_oom(1);
    let three = false_oom(3);
    assert!(
        one <= 4 * MIB && three <= 4 * MIB,
        "false out-of-memory: {} MiB short of the cap with one idle process, {} MiB with three",
        one / MIB,
        three / MIB
    );
}

/// A process holds 32 MiB of credit; another process of the container overwrites the usage file (`what`:
/// the header's magic, the whole file zeroed, or truncated to 0, as region_robust.rs and region_tamper_words.rs
/// do). Before
/// ca6432f the holder's next admission failed closed (the tamper check runs on every charge); with the credit
/// it takes 32 MiB with no check (that commit's header check, since replaced by `UsageRegion::check`, saw neither).
fn tamper(what: &str, offset: u64, bytes: Option<&[u8]>, truncate: bool) -> u64 {
    let sim = Sim::new().build();
    let mut holder = started(&sim, "hold 64");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(sim.usage_file())
        .unwrap();
    if truncate {
        f.set_len(0).unwrap();
    } else {
        let zeros = vec![0u8; f.metadata().unwrap().len() as usize];
        f.write_all_at(bytes.unwrap_or(&zeros), offset).unwrap();
    }
    drop(f);
    holder.release();
    holder.wait_ready(2);
    holder.release();
    let h = holder.finish();
    println!("{what}:{h:?}");
    h.num("taken")
}

#[test]
fn a_tampered_usage_file_still_admits_from_credit() {
    let magic = tamper("magic", 0, Some(&0x0123_4567_89ab_cdefu64.to_ne_bytes()), false);
    let zeroed = tamper("zeroed", 0, None, false);
    let truncated = tamper("truncated", 0, None, true);
    // `taken` counts 1 MiB asks; the simulator's 2 MiB granularity makes each cost 2 MiB of credit.
    assert!(
        magic == 0 && zeroed == 0 && truncated == 0,
        "admitted after the usage file was tampered with: {magic} (magic overwritten), {zeroed} (file \
         zeroed), {truncated} (file truncated) x 1 MiB asks"
    );
}

/// The claim: a process's credit is at most 32 MiB per device plus what is in flight. `threads` threads of one
/// process, started together, each keep `k` x 1 MiB: when the credit runs out on several at once, each charges a
/// chunk ahead (and `give_back_credit` on another thread may drain it meanwhile). Once they are done nothing is
/// in flight; a filler then shows what the process still holds as credit (the cap less the simulator's used
/// bytes when the filler is refused). Rounds: the race is timing-dependent; the largest is reported.
#[test]
fn credit_of_racing_threads_stays_within_its_bound() {
    let mut worst = 0;
    for round in 0..6 {
        let sim = Sim::new().build();
        let mut racer = started(&sim, "race 64 5");
        let filler = sim
            .cmd(Prog::Probe)
            .mem_limit("1g")
            .args("init fill:mem:1m simused")
            .timeout(Duration::from_secs(60))
            .run();
        filler.ok();
        racer.release();
        let r = racer.finish();
        let short = GIB.saturating_sub(filler.num("sim.used.0"));
        println!(
            "round {round}: racer got {} x 1 MiB ({} MiB real); filler refused {} MiB short of the cap",
            r.num("got"),
            r.num("used.race") / MIB,
            short / MIB
        );
        worst = worst.max(short);
    }
    assert!(
        worst <= 32 * MIB,
        "an idle process held {} MiB of credit (the bound is 32 MiB plus what is in flight)",
        worst / MIB
    );
}

/// A process holds 32 MiB of credit. Another fills the cap with 1 MiB pieces, then loads a library whose 16 MiB
/// global the driver takes lazily (the first such load cannot be known in advance: charged once taken), so the
/// ledger says the container is 16 MiB over its cap. The first process then loads a library with a 2 GiB lazy
/// global: `Memory::first_use_begin` refuses a call that may load code or globals while the container is over
/// its cap, but it reads `Memory::container_used`, which now subtracts the caller's own credit: cap + 16 MiB −
/// 32 MiB is "under", and the driver takes 2 GiB. Before ca6432f: refused.
#[test]
fn own_credit_hides_an_over_cap_container_from_the_lazy_loading_gate() {
    let sim = Sim::new().build();
    let holder = started(&sim, "holdlazy 2g");
    let filler = started(&sim, "filllazy 16m");
    let (over, after, h, f) = holder_step(&sim, holder, filler);
    println!("holder:{h:?}\nfiller:{f:?}\nsim used: {over} before the holder's load, {after} after");
    f.expect("global", "CUDA_SUCCESS");
    assert!(
        after <= over,
        "the holder's 2 GiB lazy global was let through while the container was at {} MiB of its 1 GiB cap: \
         the simulator holds {} MiB",
        over / MIB,
        after / MIB
    );
}
