//! Priority tenants on the simulator (docs/priority.md): a high-priority tenant's bursts wait for at most one
//! best-effort kernel, the best-effort tenant still fills most of the time the high-priority one leaves idle,
//! and memory reserved for high priority is never taken by a best-effort tenant.
//!
//! The tenants are `c/priority_tenant.c` in two containers (two usage files), each with its own priority file
//! in the node's priority directory. Burst latencies end on the simulator's device timeline (the program finds when its last kernel ended), and
//! shares come from the timeline (`Sim::busy_ns`). Kernels are ≥ 200 µs in bursts of 20 followed by idle gaps,
//! and the best-effort kernels are ≥ 1 ms, so neither program is CPU-heavy. Bands: the with-cuquota p99 must
//! stay within alone + one longest best-effort kernel + 5 ms of slack for a busy CPU; without cuquota the burst
//! waits behind the best-effort tenant's full queue (seconds), far outside that band.

use cuquota_core::region::layout::{PRIORITY_HIGH, PRIORITY_LOW};
use cuquota_core::region::PriorityRegion;
use shim_tests::priority::{done, latencies, ms, pct, serial, BE_NS, BURST, GAP_NS, KERNEL_NS, SECS};
use shim_tests::{mono_ns, Output, Prog, Sim, Window, GIB};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Both tenants without the shim.
    Bare,
    /// Both under cuquota with priorities (0 and 1) and their containers' priority files.
    Priority,
    /// The same, with the priorities set by the agent's limits files (`limits.hp`, `limits.be`) instead.
    AgentPriority,
}

/// A command under the agent's limits file `limits.<container>` (priority `prio`) and the priority file.
fn agent<'a>(c: shim_tests::Cmd<'a>, sim: &Sim, container: &str, prio: u32) -> shim_tests::Cmd<'a> {
    let f = sim.dir().join(format!("limits.{container}"));
    sim.agent_limits(&f, |r| r.priority = prio);
    c.env("CUQUOTA_LIMITS_FILE", f.to_str().unwrap()).env(
        "CUQUOTA_PRIORITY_FILE",
        sim.container_priority_file(container, prio == PRIORITY_HIGH)
            .to_str()
            .unwrap(),
    )
}

struct Run {
    hp: Window,
    lat_ns: Vec<u64>,
    be: Option<Window>,
}

fn hp_cmd(sim: &Sim, mode: Mode, start_at: u64) -> shim_tests::Proc {
    let c = sim
        .cmd(Prog::PriorityTenant)
        .container("hp")
        .timeout(Duration::from_secs(60))
        .args(&format!(
            "hp {SECS} {BURST} {KERNEL_NS} {} {} 7 {start_at}",
            GAP_NS.0, GAP_NS.1
        ));
    match mode {
        Mode::Bare => c.no_preload(),
        Mode::Priority => c.priority("0"),
        Mode::AgentPriority => agent(c, sim, "hp", PRIORITY_HIGH),
    }
    .spawn()
}

fn be_cmd(sim: &Sim, mode: Mode, start_at: u64) -> shim_tests::Proc {
    let c = sim
        .cmd(Prog::PriorityTenant)
        .container("be")
        .timeout(Duration::from_secs(60))
        .args(&format!(
            "be {} {} {} 11 {start_at}",
            SECS + 1.0,
            BE_NS.0,
            BE_NS.1
        ));
    match mode {
        Mode::Bare => c.no_preload(),
        Mode::Priority => c.priority("1"),
        Mode::AgentPriority => agent(c, sim, "be", PRIORITY_LOW),
    }
    .spawn()
}

/// The UUID of the device container `c` claimed in its priority file (it ran on it).
fn device_uuid(sim: &Sim, c: &str) -> [u8; 16] {
    let r = PriorityRegion::open_file(&sim.container_priority_file(c, false)).unwrap();
    r.devices(mono_ns())[0].uuid
}

/// The high-priority tenant alone (`be = None`) or with the best-effort tenant started 0.5 s before it.
fn run(sim: &Sim, mode: Mode, with_be: bool) -> Run {
    let t = mono_ns() + 1_500_000_000;
    let be = with_be.then(|| be_cmd(sim, mode, t - 500_000_000));
    let hp = done(hp_cmd(sim, mode, t).finish());
    let be = be.map(|p| done(p.finish()).window());
    let lat_ns = latencies(&hp);
    assert!(!lat_ns.is_empty(), "no burst:{hp:?}");
    Run {
        hp: hp.window(),
        lat_ns,
        be,
    }
}

/// The best-effort tenant's device time in the high-priority tenant's window, as a share of the time the
/// high-priority tenant left the device idle there.
fn be_idle_share(sim: &Sim, r: &Run) -> f64 {
    let be = r.be.expect("a best-effort tenant");
    let (from, to) = (r.hp.t0, r.hp.end);
    let hp_busy = sim.busy_ns(0, r.hp.pid, from, to);
    let be_busy = sim.busy_ns(0, be.pid, from, to);
    be_busy as f64 * 100.0 / (to - from).saturating_sub(hp_busy).max(1) as f64
}

#[test]
fn high_priority_bursts_wait_for_at_most_one_best_effort_kernel() {
    let _s = serial();
    let sim = Sim::new().build();
    sim.create_priority_dir();
    let alone = run(&sim, Mode::Bare, false);
    let bare = run(&sim, Mode::Bare, true);
    let prio = run(&sim, Mode::Priority, true);
    let (a50, a99) = (pct(&alone.lat_ns, 50.0), pct(&alone.lat_ns, 99.0));
    let (b50, b99) = (pct(&bare.lat_ns, 50.0), pct(&bare.lat_ns, 99.0));
    let (p50, p99) = (pct(&prio.lat_ns, 50.0), pct(&prio.lat_ns, 99.0));
    let idle = be_idle_share(&sim, &prio);
    for (what, r) in [("alone", &alone), ("with priority", &prio)] {
        assert!(r.lat_ns.len() >= 20, "{what}: only {} bursts", r.lat_ns.len());
    }
    println!(
        "burst latency p50/p99 ms: alone {:.2}/{:.2}, with best-effort no cuquota {:.2}/{:.2}, with cuquota \
         priority {:.2}/{:.2} ({} bursts); best-effort share of idle time {idle:.1} %",
        ms(a50),
        ms(a99),
        ms(b50),
        ms(b99),
        ms(p50),
        ms(p99),
        prio.lat_ns.len()
    );
    // The control: without cuquota the burst queues behind the best-effort tenant's whole queue.
    assert!(
        b99 > a99 + BE_NS.1 + 5_000_000,
        "the best-effort tenant did not delay the bursts without cuquota: the test shows nothing"
    );
    // The promise: at most one best-effort kernel ahead of a burst (plus slack for a busy CPU).
    assert!(
        p99 <= a99 + BE_NS.1 + 5_000_000,
        "p99 {:.2} ms with priority exceeds alone {:.2} ms + one best-effort kernel ({:.0} ms) + 5 ms",
        ms(p99),
        ms(a99),
        ms(BE_NS.1)
    );
    // Work-conserving: the goal is ≥ 80 %; a best-effort tenant held back for good would get ~0.
    assert!(idle >= 50.0, "best-effort got only {idle:.1} % of the idle time");
}

#[test]
fn priorities_from_the_agents_limits_files_are_enforced_too() {
    let _s = serial();
    let sim = Sim::new().build();
    sim.create_priority_dir();
    let alone = run(&sim, Mode::Bare, false);
    let prio = run(&sim, Mode::AgentPriority, true);
    let (a99, p99) = (pct(&alone.lat_ns, 99.0), pct(&prio.lat_ns, 99.0));
    let idle = be_idle_share(&sim, &prio);
    println!(
        "agent priorities: p99 alone {:.2} ms, with priority {:.2} ms; idle share {idle:.1} %",
        ms(a99),
        ms(p99)
    );
    assert!(
        p99 <= a99 + BE_NS.1 + 5_000_000,
        "p99 {:.2} ms with the agent's priorities exceeds alone {:.2} ms + 10 ms",
        ms(p99),
        ms(a99)
    );
    assert!(idle >= 50.0, "best-effort got only {idle:.1} % of the idle time");
}

#[test]
fn without_a_high_priority_tenant_best_effort_uses_the_whole_device() {
    let _s = serial();
    let sim = Sim::new().build();
    sim.create_priority_dir();
    let out = done(be_cmd(&sim, Mode::Priority, 0).finish());
    let w = out.window();
    let share = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("best-effort alone: {share:.1} % of the device");
    assert!(share >= 85.0, "best-effort alone got {share:.1} %");
}

/// `hp` allocates `hp_alloc` while a best-effort tenant whose limits keep `reserve` free holds what it could
/// get of 12 GiB + 1 GiB on a 16 GiB device.
fn reserve_scenario(reserve: u64) -> (Output, Output) {
    let sim = Sim::new().memory("16g").build();
    sim.create_priority_dir();
    let limits = sim.dir().join("limits.be");
    sim.agent_limits(&limits, |r| r.reserved_memory = reserve);
    let mut be = sim
        .cmd(Prog::Probe)
        .container("be")
        .priority("1")
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .args("init alloc:mem:12g alloc:mem:1g wait")
        .timeout(Duration::from_secs(60))
        .spawn();
    be.wait_ready(1);
    let hp = sim
        .cmd(Prog::Probe)
        .container("hp")
        .priority("0")
        .args("init alloc:mem:4g")
        .run();
    be.release();
    (be.finish(), hp)
}

#[test]
fn reserved_memory_is_left_for_the_high_priority_tenant() {
    let (be, hp) = reserve_scenario(4 * GIB);
    be.ok().expect("alloc.0", "CUDA_SUCCESS");
    be.expect("alloc.1", "CUDA_ERROR_OUT_OF_MEMORY");
    hp.ok().expect("alloc.0", "CUDA_SUCCESS");
    // The control: without the reservation the best-effort tenant takes the memory and the high-priority
    // allocation fails.
    let (be, hp) = reserve_scenario(0);
    be.ok().expect("alloc.1", "CUDA_SUCCESS");
    hp.ok().expect("alloc.0", "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn a_reservation_without_a_priority_file_fails_closed() {
    let sim = Sim::new().memory("16g").build();
    let limits = sim.dir().join("limits.be");
    sim.agent_limits(&limits, |r| r.reserved_memory = 4 * GIB);
    let out = sim
        .cmd(Prog::Probe)
        .container("be")
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .args("init alloc:mem:1g")
        .run();
    out.ok().expect("alloc.0", "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn the_cli_creates_and_shows_the_priority_file() {
    let sim = Sim::new().build();
    // The agent creates the high-priority container's file in the node directory.
    let f = sim.create_priority_dir().join("hp.high");
    let f = f.to_str().unwrap();
    let out = sim.cli(&["priority", "init", f]);
    assert!(out.success(), "{out:?}");
    // A high-priority launch registers the device.
    let run = sim
        .cmd(Prog::PriorityTenant)
        .container("hp")
        .priority("0")
        .args("hp 0.2 2 200000 1000000 2000000 7")
        .run();
    assert!(run.success(), "{run:?}");
    let out = sim.cli(&["priority", "show", f, "--json"]);
    assert!(out.success(), "{out:?}");
    let v = shim_tests::check_schema("priority.v1.json", &out.lines.join("\n"));
    let dev = &v["devices"][0];
    assert!(dev["high_launches"].as_u64().unwrap() >= 2, "{v}");
    // init on an existing file checks it; on something else it fails.
    assert!(sim.cli(&["priority", "init", f]).success());
    let bogus = sim.dir().join("bogus");
    std::fs::write(&bogus, b"not a priority file").unwrap();
    assert!(!sim.cli(&["priority", "init", bogus.to_str().unwrap()]).success());
}

/// Issue 35 item 5: with a counters file beside its own (`priority.counters`, as the DRA plugin mounts it), a
/// high-priority container's launch count goes there, not into its file in the node directory that every other
/// container reads; the owner still sees it (`priority show` of its own file adds the counters file). Main's
/// library counted every launch in the shared file (`high_launches` 2 there). Control: the same launches
/// without a counters file are counted in the shared file.
#[test]
fn a_containers_launch_counts_stay_out_of_the_node_directory() {
    let sim = Sim::new().build();
    let show = |f: &std::path::Path| {
        let out = sim.cli(&["priority", "show", f.to_str().unwrap(), "--json"]);
        assert!(out.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_str(&out.lines.join("\n")).unwrap();
        v["devices"][0]["high_launches"].as_u64().unwrap_or(0)
    };
    let launch = |name: &str| {
        let run = sim
            .cmd(Prog::PriorityTenant)
            .container(name)
            .priority("0")
            .args("hp 0.2 2 200000 1000000 2000000 7")
            .run();
        assert!(run.success(), "{run:?}");
    };
    let own = sim.container_priority_file("hp", true);
    let mut counters = own.clone().into_os_string();
    counters.push(".counters");
    PriorityRegion::create(std::path::Path::new(&counters)).unwrap();
    launch("hp");
    let shared = sim.priority_dir().join("hp.high");
    let (theirs, mine) = (show(&shared), show(&own));
    println!("high_launches: {theirs} in the node directory's file, {mine} in its own view");
    assert_eq!(theirs, 0, "launch counts readable by every container");
    assert!(mine >= 2, "the owner's counts: {mine}");
    // Control: no counters file, the counts land in the shared file.
    sim.container_priority_file("other", true);
    launch("other");
    assert!(show(&sim.priority_dir().join("other.high")) >= 2);
}

/// Threat model: a tenant that scribbles times far in the future into the priority file (or a file kept across a
/// reboot) cannot stall best-effort tenants; plausible values are obeyed (the control: the gate reads them).
#[test]
fn garbage_in_the_priority_file_does_not_stall_best_effort_tenants() {
    let _s = serial();
    let sim = Sim::new().build();
    // The scribbler is a high-priority container (the only one whose file best-effort tenants read).
    let region = PriorityRegion::open_file(&sim.container_priority_file("hp", true)).unwrap();
    let be = |secs: f64| {
        let o = done(
            sim.cmd(Prog::PriorityTenant)
                .container("be")
                .priority("1")
                .timeout(Duration::from_secs(60))
                .args(&format!("be {secs} 1000000 2000000 11"))
                .spawn()
                .finish(),
        );
        let w = o.window();
        sim.share_pct(0, w.pid, w.t0, w.end)
    };
    be(0.2); // claims the device's entry in its file
    let id = region.device(&device_uuid(&sim, "be")).unwrap();
    let e = region.entry(id);
    // The best-effort container's own token (a scribbler of its own container can only write that).
    let be_file = PriorityRegion::open_file(&sim.container_priority_file("be", false)).unwrap();
    let be_token = be_file.entry(be_file.devices(mono_ns())[0].id);
    // A scribbler: a high-priority tenant "launching" an hour from now, the token held for an hour.
    // (The warm-up ran gated, the `.high` file being there: its hold of the token may not have expired yet.)
    let hour = 3_600_000_000_000;
    let t0 = mono_ns();
    let now = loop {
        let now = mono_ns();
        if be_token.take_token(now, now + hour).is_ok() {
            break now;
        }
        assert!(now - t0 < 5_000_000_000, "the warm-up's token never expired");
        std::thread::sleep(Duration::from_millis(10));
    };
    e.note_hp_launch(now + hour, now + hour);
    let share = be(2.0);
    println!("best-effort with garbage in the priority file: {share:.1} %");
    // The `.high` file makes a tenant present: best-effort keeps its budget (one 1–2 ms kernel at a time,
    // 84–89 % here); garbage obeyed would hold it back for an hour (0 %).
    assert!(
        share >= 50.0,
        "garbage stalled the best-effort tenant: {share:.1} %"
    );
    // A high-priority tenant present (it launched just now, its queue empty) but the token still held for an
    // hour: the token is garbage, taken over; best-effort runs one kernel at a time.
    let now = mono_ns();
    e.note_hp_launch(now, now);
    let share = be(2.0);
    println!("best-effort with a present high-priority tenant and a garbage token: {share:.1} %");
    assert!(
        share >= 50.0,
        "a garbage token stalled the best-effort tenant: {share:.1} %"
    );
    // The control: a high-priority queue published as busy for the next 3 s holds it back.
    let now = mono_ns();
    e.note_hp_launch(now, now + 3_000_000_000);
    let share = be(2.0);
    println!("best-effort behind a published 3 s high-priority queue: {share:.1} %");
    assert!(
        share < 50.0,
        "the gate ignored a plausible high-priority queue: {share:.1} %"
    );
}

/// The limits file's priority is live and the lower of it and the file name wins: a tenant whose file says `.high`
/// (no priority in the limits file) launches freely past a published high-priority queue, and starts yielding
/// to it as soon as the agent marks it low priority.
#[test]
fn a_priority_set_live_in_the_limits_file_applies_to_a_running_tenant() {
    let _s = serial();
    let _h = shim_tests::heavy(); // 100–200 µs kernels, launched flat out until the change
    let sim = Sim::new().build();
    let region = PriorityRegion::open_file(&sim.container_priority_file("hp", true)).unwrap();
    let limits = sim.dir().join("limits.be");
    sim.agent_limits(&limits, |r| r.priority = 0);
    let start = mono_ns() + 1_000_000_000;
    let p = sim
        .cmd(Prog::PriorityTenant)
        .container("be")
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .env(
            "CUQUOTA_PRIORITY_FILE",
            sim.container_priority_file("be", true).to_str().unwrap(),
        )
        .timeout(Duration::from_secs(60))
        .args(&format!("be 3 100000 200000 11 {start}"))
        .spawn();
    // A high-priority tenant whose queue is busy for the next 5 s, published before the change: ignored by a
    // tenant the agent granted high priority (its file `be.high`) and gave no priority in the limits file.
    std::thread::sleep(Duration::from_nanos(start.saturating_sub(mono_ns())));
    let be_file = PriorityRegion::open_file(&sim.container_priority_file("be", true)).unwrap();
    let uuid = loop {
        if let Some(d) = be_file.devices(mono_ns()).first() {
            break d.uuid;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let e = region.entry(region.device(&uuid).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    let now = mono_ns();
    e.note_hp_launch(now, now + 5_000_000_000);
    let before_change = mono_ns();
    std::thread::sleep(Duration::from_millis(500));
    let change = mono_ns();
    sim.agent_limits(&limits, |r| r.priority = PRIORITY_LOW);
    let out = done(p.finish());
    let w = out.window();
    let before = sim.share_pct(0, w.pid, start, before_change.min(w.end));
    // From 300 ms after the change (what it queued before drains: ≤ 1024 kernels of ≤ 200 µs) to its end.
    let after = sim.share_pct(0, w.pid, change + 300_000_000, w.end);
    println!("best-effort before the change {before:.1} %, after {after:.1} %");
    assert!(before >= 50.0, "without a priority it did not run: {before:.1} %");
    assert!(after <= 10.0, "the live priority did not apply: {after:.1} %");
}

/// Multi-device cooperative launches (`cuLaunchCooperativeKernelMultiDevice`) of a best-effort tenant are
/// gated like its single launches (issue 23); without cuquota they queue in front of the bursts (the control).
#[test]
fn multi_device_cooperative_launches_are_gated_too() {
    let _s = serial();
    let sim = Sim::new().build();
    sim.create_priority_dir();
    // 1–3 ms: a cooperative grid has at most 32 blocks per SM, and a kernel here is waves of kmin / 10.
    let be_ns = (1_000_000, 3_000_000);
    let run = |bare: bool, with_be: bool| {
        let t = mono_ns() + 1_500_000_000;
        let be = with_be.then(|| {
            let c = sim.cmd(Prog::PriorityTenant).container("be");
            let c = if bare { c.no_preload() } else { c.priority("1") };
            c.env("PT_BE_MULTI", "1")
                .timeout(Duration::from_secs(60))
                .args(&format!(
                    "be {} {} {} 11 {}",
                    SECS + 1.0,
                    be_ns.0,
                    be_ns.1,
                    t - 500_000_000
                ))
                .spawn()
        });
        let c = sim.cmd(Prog::PriorityTenant).container("hp");
        let c = if bare { c.no_preload() } else { c.priority("0") };
        let hp = done(
            c.timeout(Duration::from_secs(60))
                .args(&format!(
                    "hp {SECS} {BURST} {KERNEL_NS} {} {} 7 {t}",
                    GAP_NS.0, GAP_NS.1
                ))
                .spawn()
                .finish(),
        );
        if let Some(b) = be {
            let b = done(b.finish());
            assert!(b.num("kernels") > 0, "{b:?}");
        }
        latencies(&hp)
    };
    let alone = run(true, false);
    let bare = run(true, true);
    let prio = run(false, true);
    let (a99, b99, p99) = (pct(&alone, 99.0), pct(&bare, 99.0), pct(&prio, 99.0));
    println!(
        "multi-device best-effort: burst p99 alone {:.2} ms, no cuquota {:.2} ms, priority {:.2} ms ({} bursts)",
        ms(a99),
        ms(b99),
        ms(p99),
        prio.len()
    );
    let bound = a99 + be_ns.1 + 5_000_000;
    assert!(
        b99 > bound,
        "the control: multi-device launches did not delay the bursts without cuquota"
    );
    assert!(
        p99 <= bound,
        "p99 {:.2} ms next to ungated multi-device launches > {:.2} ms",
        ms(p99),
        ms(bound)
    );
    assert!(prio.len() >= 20, "only {} bursts", prio.len());
}
