//! Hostile review of commit f9c1ecb: the per-process credit kept in the usage file (`UsageSlot::credit`,
//! core's `UsageRegion::take_credit` and siblings, src/memory/credit.rs, `Memory::admit`). Each test states a
//! claim of the commit and FAILS where the claim does not hold. Judged by the simulator's own used bytes (its
//! NVML past any interposer). Programs: `c/credit_holder.c` (its `hold` mode: 32 MiB of credit, then 1 MiB
//! asks on a line) and the probe. At most two simulated processes run at once.

use cuquota_core::region::layout::{UsageFile, UsageSlot, MAX_PROCS};
use shim_tests::credit::{holder_step, prog, sim_used, started};
use shim_tests::{Prog, Sim, GIB, MIB};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

/// The claim: "no credit is spent once the container is over its cap". The credit is taken back only when
/// someone is refused or a reconciliation finds the container over its cap; `Credit::on_under` only compares
/// the cap the credit was charged under with today's. A process holds 32 MiB of credit under the agent's 1 GiB
/// cap; the agent raises the cap to 4 GiB, another process of the container takes 2 GiB (admitted, nobody
/// refused), the agent sets 1 GiB again. The container is now 1 GiB over its cap, yet the holder's 1 MiB asks
/// are taken from its credit (same cap as when charged) with no look at the sum; before f9c1ecb each was
/// charged against the sum and refused. Per process holding credit, per device (entries 0-4).
#[test]
fn credit_is_spent_while_the_container_is_over_a_cap_the_agent_set_again() {
    let sim = Sim::new().build();
    sim.agent_memory_limit(0, "1g");
    let mut holder = sim
        .cmd_path(prog())
        .args("hold 64")
        .timeout(Duration::from_secs(60))
        .spawn();
    holder.wait_ready(1);
    sim.agent_memory_limit(0, "4g");
    let mut other = sim
        .cmd(Prog::Probe)
        .args("init alloc:mem:2g wait")
        .timeout(Duration::from_secs(60))
        .spawn();
    other.wait_ready(1);
    sim.agent_memory_limit(0, "1g");
    let (over, after, h, o) = holder_step(&sim, holder, other);
    println!("holder:{h:?}\nother:{o:?}\nsim used: {over} over the cap, {after} after the holder's asks");
    o.expect("alloc.0", "CUDA_SUCCESS");
    assert!(over > GIB, "the container is not over its 1 GiB cap");
    assert_eq!(
        h.num("taken"),
        0,
        "the container was {} MiB over its 1 GiB cap, yet a process took {} x 1 MiB from its credit: the \
         simulator went from {} to {} MiB",
        (over - GIB) / MIB,
        h.num("taken"),
        over / MIB,
        after / MIB
    );
}

/// Byte offset in the usage file of slot `i`'s field at `field` (an offset within `UsageSlot`).
fn slot_field(i: usize, field: usize) -> u64 {
    (std::mem::offset_of!(UsageFile, slots) + i * std::mem::size_of::<UsageSlot>() + field) as u64
}

/// The usage-file slot whose owner word names `pid`.
fn slot_of(usage: &Path, pid: u32) -> usize {
    let f = std::fs::File::open(usage).unwrap();
    (0..MAX_PROCS)
        .find(|&i| {
            let mut w = [0u8; 8];
            f.read_exact_at(&mut w, slot_field(i, std::mem::offset_of!(UsageSlot, owner)))
                .unwrap();
            u64::from_ne_bytes(w) as u32 == pid
        })
        .unwrap_or_else(|| panic!("no slot for pid {pid}"))
}

/// A process of the container (anyone who can write the usage file: the tenant itself) writes `value` into the
/// holder's own word at `field` of its slot (device entry 0), then the holder asks for 2048 x 1 MiB under a
/// 1 GiB cap. Returns (asks taken, the simulator's used bytes after them).
fn write_own_word(field: usize, value: u64) -> (u64, u64) {
    let sim = Sim::new().build();
    let mut holder = sim
        .cmd_path(prog())
        .mem_limit("1g")
        .args("hold 2048")
        .timeout(Duration::from_secs(120))
        .spawn();
    holder.wait_ready(1);
    let i = slot_of(&sim.usage_file(), holder.pid());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(sim.usage_file())
        .unwrap();
    f.write_all_at(&value.to_ne_bytes(), slot_field(i, field))
        .unwrap();
    drop(f);
    holder.release();
    holder.wait_ready(2);
    let after = sim_used(&sim);
    holder.release();
    let h = holder.finish();
    (h.num("taken"), after)
}

/// What a tenant gains by writing the usage file it can already write. Control: ONE write of its own
/// `mem_used` to 0 erases ~50 MiB of its charge, and the reconciliation with the driver's figure near the cap
/// (`Memory::near_cap_check`, the container's NVML figure) still stops it at the cap. ONE write of its own
/// credit word to 8 GiB: every later admission is a compare-and-swap on that word (`UsageRegion::take_credit`
/// only checks the word holds enough), never charged, never summed, never reconciled: the driver's figure is
/// not the last word any more. (A credit word above `credit::MAX` can only be a forgery.)
#[test]
fn one_write_of_the_own_credit_word_lifts_the_cap() {
    let mem_used = std::mem::offset_of!(UsageSlot, mem_used);
    let credit = std::mem::offset_of!(UsageSlot, credit);
    let (taken_m, used_m) = write_own_word(mem_used, 0);
    let (taken_c, used_c) = write_own_word(credit, 8 * GIB);
    println!(
        "mem_used zeroed: {taken_m} x 1 MiB taken, simulator at {} MiB; credit word at 8 GiB: {taken_c} x 1 MiB \
         taken, simulator at {} MiB (cap 1024 MiB)",
        used_m / MIB,
        used_c / MIB
    );
    assert!(
        used_m <= GIB + 8 * MIB,
        "control: one write of mem_used let the process to {} MiB of a 1 GiB cap",
        used_m / MIB
    );
    assert!(
        used_c <= GIB + 8 * MIB,
        "one write of the own credit word let the process to {} MiB of a 1 GiB cap ({taken_c} x 1 MiB asks \
         admitted; with mem_used zeroed instead: {} MiB)",
        used_c / MIB,
        used_m / MIB
    );
}

/// Whether a slot of the usage file is still owned by `pid` (its owner word names it).
fn has_slot(usage: &Path, pid: u32) -> bool {
    let f = std::fs::File::open(usage).unwrap();
    (0..MAX_PROCS).any(|i| {
        let mut w = [0u8; 8];
        f.read_exact_at(&mut w, slot_field(i, std::mem::offset_of!(UsageSlot, owner)))
            .unwrap();
        u64::from_ne_bytes(w) as u32 == pid
    })
}

/// A program that frees everything and ends its context gives its slot back at a clean exit
/// (`UsageRegion::release_process_slot`: only a slot with nothing charged). With credit on, the credit's
/// bytes stay in `mem_used` (nothing drains a process's own credit at exit, `state.rs`), so the slot of
/// every process that made 9 small allocations is kept, charged, until somebody's reclaim reads /proc; old
/// versions of the library in the container count that charge as held. Control: 3 small allocations.
#[test]
fn a_clean_exit_after_small_allocations_gives_its_slot_back() {
    let sim = Sim::new().build();
    let kept = |n: usize| {
        let allocs = vec!["alloc:mem:1m"; n].join(" ");
        let out = sim
            .cmd(Prog::Probe)
            .mem_limit("1g")
            .args(&format!("init pid {allocs} freeall release"))
            .run();
        out.ok();
        let pid = out.num("pid") as u32;
        has_slot(&sim.usage_file(), pid)
    };
    let three = kept(3);
    let ten = kept(10);
    assert!(
        !three,
        "control: a process with 3 small allocations kept its slot"
    );
    assert!(
        !ten,
        "a process with 10 small allocations, all freed, its context released, kept its slot (and its credit \
         charged) after a clean exit"
    );
}

/// The claim: "idle credit never refuses another process" and "old-version processes interoperate". A
/// process of the new library holds 32 MiB of idle credit; a filler of the container running the library of
/// 94842bd (the parent: these words were reserved; its `UsageRegion::charge_again` takes no credit back) fills
/// with 1 MiB pieces and is refused 32 MiB short of the cap (per idle new process). Control: a filler of the
/// new library reaches the cap. Needs `CUQUOTA_TEST_OLD_SHIM` = a libcuquota.so built from 94842bd
/// (`git archive 94842bd | tar -x -C DIR && cd DIR && CARGO_TARGET_DIR=DIR/target cargo build -p cuquota`);
/// fails without it. Accepted and documented (docs/interception.md "Credit"): credit charged before a process
/// of an earlier version joined is not taken back by it, so it may be refused up to 32 MiB per idle holder early
/// (no new credit is charged while it lives: core's `forged_credit_and_slots_that_do_not_know_credit`); the
/// test holds that bound.
#[test]
#[ignore = "needs CUQUOTA_TEST_OLD_SHIM, a libcuquota.so built from 94842bd"]
fn idle_credit_refuses_a_process_of_the_previous_version() {
    let old = std::env::var("CUQUOTA_TEST_OLD_SHIM")
        .expect("set CUQUOTA_TEST_OLD_SHIM to a libcuquota.so built from 94842bd");
    let short = |preload: Option<&str>| {
        let sim = Sim::new().build();
        let mut holder = started(&sim, "hold 0");
        let mut filler = sim
            .cmd(Prog::Probe)
            .mem_limit("1g")
            .args("init fill:mem:1m simused")
            .timeout(Duration::from_secs(60));
        if let Some(p) = preload {
            filler = filler.env("LD_PRELOAD", p);
        }
        let out = filler.run();
        out.ok();
        holder.release();
        holder.wait_ready(2);
        holder.release();
        holder.finish();
        GIB.saturating_sub(out.num("sim.used.0"))
    };
    let new = short(None);
    let previous = short(Some(&old));
    println!(
        "filler refused {} MiB short of the 1 GiB cap (new library), {} MiB short (library of 94842bd)",
        new / MIB,
        previous / MIB
    );
    assert!(new <= 4 * MIB, "control: {} MiB short", new / MIB);
    assert!(
        previous <= 36 * MIB,
        "a process of the previous version was refused {} MiB short of the cap by one idle holder's credit \
         (the bound: its 32 MiB)",
        previous / MIB
    );
}

/// Allocations of a process of the container that reconciled with NVML ("reconciled near the cap" in its debug
/// log): the worker makes its context, then `holders` processes each take 32 MiB of credit and another takes
/// 700 MiB under the 1 GiB cap (margin 256 MiB); then the worker allocates and frees 1 MiB 200 times.
fn reconciles(holders: usize) -> usize {
    let sim = Sim::new().build();
    let mut worker = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .env("CUQUOTA_LOG", "debug")
        .args("init wait threads:1:200:1m simused")
        .timeout(Duration::from_secs(60))
        .spawn();
    worker.wait_ready(1);
    let mut procs: Vec<_> = (0..holders).map(|_| started(&sim, "hold 0")).collect();
    let mut big = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:700m wait")
        .timeout(Duration::from_secs(60))
        .spawn();
    big.wait_ready(1);
    worker.release();
    let w = worker.finish();
    big.release();
    big.finish().expect("alloc.0", "CUDA_SUCCESS");
    for p in procs.iter_mut() {
        p.release();
        p.wait_ready(2);
        p.release();
    }
    for p in procs {
        p.finish();
    }
    let n = w.stderr.matches("reconciled near the cap").count();
    println!(
        "{holders} idle holders: {n} of the worker's 200 allocations asked NVML (simulator at {} MiB of 1024, \
         threads.ok={})",
        w.num("sim.used.0") / MIB,
        w.num("threads.ok")
    );
    n
}

/// "No NVML call per allocation far from the cap": the container really holds ~710 MiB of its 1 GiB (more
/// than the 256 MiB margin left), but three processes' idle credit (96 MiB, charged) puts the ledger inside
/// the margin, so every allocation of the container's other processes asks NVML (`Memory::near_cap_check`
/// judges by `container_used`, credit included). The reconciliation gives back only the caller's own credit
/// and finds the container under its cap: nothing takes the others' credit back, so it goes on for as long as
/// they stay idle. Control: without the holders, no allocation asks NVML.
#[test]
fn idle_credit_makes_every_allocation_of_the_container_ask_nvml() {
    let none = reconciles(0);
    let three = reconciles(3);
    assert_eq!(none, 0, "control: {none} reconciliations");
    assert!(
        three <= 2,
        "with 96 MiB of idle credit in the container, {three} of another process's 200 allocations asked NVML \
         (none without the credit)"
    );
}
