//! The device timeline: when each kernel runs.
//!
//! A kernel takes `waves × ns_per_wave`, waves = ⌈blocks / SMs⌉. Kernels run one at a time per device across
//! every process sharing the state file (time-slicing): a launch starts at max(now, its stream's tail, the
//! device's `busy_until`) and advances `busy_until` with a CAS loop, so concurrent launchers from any process
//! queue up without a lock. Each interval goes into the device's ring (for NVML utilisation) and its length
//! into the per-process and per-device busy counters. Time is CLOCK_MONOTONIC in ns; waits sleep.

use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::config::MAX_DEVICES;
use crate::state::{DeviceState, SharedState, MAX_SLICES, RING, SHIFTS};

/// CLOCK_MONOTONIC now, in ns.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME now, in µs (NVML timestamps).
pub(crate) fn realtime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Sleeps (never spins) until CLOCK_MONOTONIC reaches `t`, and in the time-slicing model on until the time `t`
/// became if other processes' slices moved it meanwhile (the work it waits for was switched out).
pub(crate) fn sleep_until(mut t: u64) {
    loop {
        sleep_until_once(t);
        let later = later_by_shifts(t);
        if later <= t {
            return;
        }
        t = later;
    }
}

fn sleep_until_once(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    loop {
        // SAFETY: an absolute sleep on a timespec we own; EINTR restarts it.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            break;
        }
    }
}

/// Kernel duration: ⌈blocks / sms⌉ waves × `ns_per_wave`.
pub(crate) fn kernel_duration(grid: [u32; 3], sms: u64, ns_per_wave: u64) -> u64 {
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    blocks.div_ceil(sms.max(1)).saturating_mul(ns_per_wave)
}

/// Reserves [start, end) on the device timeline for a kernel of `dur` ns that may not start before
/// `earliest`. Lock-free across processes.
pub(crate) fn reserve(dev: &DeviceState, earliest: u64, dur: u64) -> (u64, u64) {
    reserve_on(&dev.busy_until, earliest, dur)
}

/// Reserves [start, end) of `dur` ns not before `earliest` on a timeline whose work ends at `busy` (the
/// device's kernels, or one of its copy engines). Lock-free across processes.
pub(crate) fn reserve_on(busy: &AtomicU64, earliest: u64, dur: u64) -> (u64, u64) {
    let mut cur = busy.load(Acquire);
    loop {
        let start = earliest.max(cur);
        let end = start + dur;
        match busy.compare_exchange_weak(cur, end, AcqRel, Acquire) {
            Ok(_) => return (start, end),
            Err(v) => cur = v,
        }
    }
}

/// Most a process may hold the slice lock (no syscall inside) before others take it over: only a process
/// killed inside it holds it longer.
const SLICE_LOCK_STALE_NS: u64 = 50_000_000;

/// Ring entries a shift looks at: reserved (future) work is among the newest, an entry or so per slice.
const SHIFT_SCAN: u64 = 2 * MAX_SLICES as u64;

/// One time slice: `owner` (slot + 1) has the device during [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sl {
    pub owner: u64,
    pub start: u64,
    pub end: u64,
}

/// [start, end) pieces, or (at, len) shifts.
type Spans = Vec<(u64, u64)>;

/// The time-slicing model's parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slicing {
    pub quantum: u64,
    pub switch: u64,
}

/// Where `owner`'s `dur` ns of work, ready at `earliest`, runs on the reserved future `slices` (in order;
/// `tail_owner` ran last when there are none; `busy` = when the reserved work ends), round-robin: the work
/// extends the owner's last slice while that has room (< a quantum), else goes in where its turn comes after the
/// slice running (or next to run) at that time, in the owners' fixed cyclic order (`its_turn`), with a switch
/// before and after it, moving all later work (its owners' kernels are then switched out); after all reserved
/// work it starts a switch after it (idle time absorbing the switch).
/// The last slice is a run of quanta (a process with nobody queued after it extends it without bound): one
/// entry however deep its queue, cut at the quantum boundary after the time another process's work is ready.
/// Updates `slices` and `busy`; returns the pieces [start, end) and the shifts (at, len), in order.
pub(crate) fn place(
    slices: &mut Vec<Sl>,
    busy: &mut u64,
    tail_owner: u64,
    owner: u64,
    earliest: u64,
    dur: u64,
    p: Slicing,
) -> (Spans, Spans) {
    let q = p.quantum.max(1);
    let sw = p.switch;
    // A process's work runs in the order it was queued.
    let mut t = slices
        .iter()
        .filter(|s| s.owner == owner)
        .map(|s| s.end)
        .fold(earliest, u64::max);
    let (mut pieces, mut shifts) = (Vec::new(), Vec::new());
    let mut rem = dur;
    let mut shift_from = |slices: &mut Vec<Sl>, busy: &mut u64, i: usize, at: u64, len: u64| {
        if len == 0 || i >= slices.len() {
            return;
        }
        for s in &mut slices[i..] {
            s.start += len;
            s.end += len;
        }
        *busy += len;
        shifts.push((at, len));
    };
    while rem > 0 {
        // Room for two cuts and a slice let in after them.
        let full = slices.len() + 3 > MAX_SLICES;
        let end_i = slices.len().wrapping_sub(1);
        // The owner's slice ends here and has room (the last always has: its quanta go on).
        if let Some(i) = slices
            .iter()
            .rposition(|s| s.owner == owner && s.end == t && (full || s.end - s.start < q))
            .or_else(|| {
                Some(end_i).filter(|&i| slices.get(i).is_some_and(|s| s.owner == owner && s.end == t))
            })
        {
            let n = if i == end_i {
                rem
            } else {
                rem.min(q - (t - slices[i].start).min(q))
            };
            if n > 0 {
                shift_from(slices, busy, i + 1, t, n);
                slices[i].end += n;
                *busy = (*busy).max(slices[i].end);
                pieces.push((t, t + n));
                rem -= n;
                t += n;
                continue;
            }
        }
        let running = slices.iter().position(|s| s.end > t);
        // A run of several quanta: its quantum running (or next to run) at t ends at the next boundary.
        if let Some(i) = running.filter(|_| !full) {
            let s = slices[i];
            let b = s.start + (t.saturating_sub(s.start) / q + 1) * q;
            if b < s.end {
                slices[i].end = b;
                slices.insert(i + 1, Sl { start: b, ..s });
            }
        }
        // Round-robin in a fixed order of owners: in at the first boundary from the slice running (or next to
        // run) at t where its turn comes, i.e. after each owner between it and the running one had its slice.
        let find = |slices: &[Sl], i: usize| {
            (i..slices.len().saturating_sub(1))
                .find(|&j| its_turn(slices[j].owner, owner, slices[j + 1].owner))
        };
        let mut turn = running.and_then(|i| find(slices, i));
        // Its turn comes only at the end, behind a run of quanta: the run yields after its first quantum.
        if let (None, Some(i), false) = (turn, running, full) {
            let l = slices.len() - 1;
            let s = slices[l];
            if l > i && s.end - s.start > q {
                slices[l].end = s.start + q;
                slices.push(Sl {
                    start: s.start + q,
                    ..s
                });
                turn = find(slices, i);
            }
        }
        match turn {
            Some(i) if !full => {
                let b = slices[i].end;
                let n = rem.min(q);
                let gap = slices[i + 1].start - b;
                shift_from(slices, busy, i + 1, b, (2 * sw + n).saturating_sub(gap));
                slices.insert(
                    i + 1,
                    Sl {
                        owner,
                        start: b + sw,
                        end: b + sw + n,
                    },
                );
                pieces.push((b + sw, b + sw + n));
                rem -= n;
                t = b + sw + n;
            }
            // After all reserved work.
            _ => {
                let last = slices.last().map_or(tail_owner, |s| s.owner);
                let ready = if last != 0 && last != owner {
                    *busy + sw
                } else {
                    *busy
                };
                let start = t.max(ready);
                let n = rem;
                match slices.last_mut() {
                    Some(s) if full => {
                        // No room for another slice: the last grows (round-robin resumes as the list drains).
                        s.end = start + n;
                        if s.owner != owner {
                            s.owner = owner;
                        }
                    }
                    _ => slices.push(Sl {
                        owner,
                        start,
                        end: start + n,
                    }),
                }
                pieces.push((start, start + n));
                *busy = start + n;
                rem -= n;
                t = start + n;
            }
        }
    }
    (pieces, shifts)
}

/// In a runlist cycled in the order of owners, does `x`'s turn come between `a`'s slice and `b`'s?
fn its_turn(a: u64, x: u64, b: u64) -> bool {
    use std::cmp::Ordering::*;
    match a.cmp(&b) {
        Less => a < x && x < b,
        Greater => x > a || x < b,
        Equal => x != a,
    }
}

/// The slice lock of `dev`, released on drop.
struct SliceGuard<'a>(&'a DeviceState);

impl<'a> SliceGuard<'a> {
    fn lock(dev: &'a DeviceState) -> Self {
        loop {
            let now = now_ns();
            let held = dev.slice_lock.load(Acquire);
            let stale = held != 0 && now.saturating_sub(held) > SLICE_LOCK_STALE_NS;
            if (held == 0 || stale)
                && dev
                    .slice_lock
                    .compare_exchange(held, now.max(1), AcqRel, Acquire)
                    .is_ok()
            {
                return SliceGuard(dev);
            }
            std::thread::yield_now();
        }
    }

    /// The slices that have not ended by `now` (and whose work ran last before them).
    fn load(&self, now: u64) -> (Vec<Sl>, u64) {
        let d = self.0;
        let n = (d.n_slices.load(Relaxed) as usize).min(MAX_SLICES);
        let mut tail_owner = d.owner.load(Relaxed);
        let mut v = Vec::with_capacity(n + 4);
        for s in &d.slices[..n] {
            let sl = Sl {
                owner: s.owner.load(Relaxed),
                start: s.start.load(Relaxed),
                end: s.end.load(Relaxed),
            };
            if sl.end <= now {
                tail_owner = sl.owner;
            } else {
                v.push(sl);
            }
        }
        (v, tail_owner)
    }

    fn store(&self, v: &[Sl], tail_owner: u64) {
        let d = self.0;
        for (s, sl) in d.slices.iter().zip(v) {
            s.owner.store(sl.owner, Relaxed);
            s.start.store(sl.start, Relaxed);
            s.end.store(sl.end, Relaxed);
        }
        d.n_slices.store(v.len().min(MAX_SLICES) as u64, Relaxed);
        d.owner.store(tail_owner, Relaxed);
    }
}

impl Drop for SliceGuard<'_> {
    fn drop(&mut self) {
        self.0.slice_lock.store(0, Release);
    }
}

/// Moves every ring interval after `at` by `len` (one that straddles `at` is cut there and its rest moved:
/// that kernel was switched out), and logs the shift for the processes' own times.
fn apply_shift(dev: &DeviceState, owner: u64, at: u64, len: u64) {
    let next = dev.ring_next.load(Acquire);
    for idx in next.saturating_sub(SHIFT_SCAN)..next {
        let e = &dev.ring[(idx % RING as u64) as usize];
        let s1 = e.seq.load(Acquire);
        if s1 != 2 * idx + 2 || e.end.load(Acquire) <= at {
            continue;
        }
        let (pid, start, end) = (e.pid.load(Relaxed), e.start.load(Relaxed), e.end.load(Relaxed));
        e.seq.store(s1 + 1, Release);
        if start >= at {
            e.start.store(start + len, Relaxed);
            e.end.store(end + len, Relaxed);
        } else {
            e.end.store(at, Relaxed);
        }
        e.seq.store(s1, Release);
        if start < at {
            let mut none = None;
            record(dev, pid as u32, at + len, end + len, &mut none);
        }
    }
    let i = dev.shift_seq.load(Relaxed);
    let sh = &dev.shifts[(i % SHIFTS as u64) as usize];
    sh.at.store(at, Relaxed);
    sh.len.store(len, Relaxed);
    sh.owner.store(owner, Relaxed);
    dev.shift_seq.store(i + 1, Release);
}

/// Time-slicing model: reserves `dur` ns of the process in `slot` (NVML pid `pid`) not before `earliest`
/// (`place`), records its pieces in the ring and moves the work it let itself in before. Returns (start, end)
/// of the whole span: the work occupies the device only in its pieces.
pub(crate) fn reserve_sliced(
    dev: &DeviceState,
    slot: usize,
    pid: u32,
    p: Slicing,
    earliest: u64,
    dur: u64,
    last: &mut Option<(u64, u64)>,
) -> (u64, u64) {
    let g = SliceGuard::lock(dev);
    let (mut v, tail_owner) = g.load(now_ns());
    let mut busy = dev.busy_until.load(Acquire);
    let (pieces, shifts) = place(&mut v, &mut busy, tail_owner, slot as u64 + 1, earliest, dur, p);
    for (at, len) in shifts {
        apply_shift(dev, slot as u64 + 1, at, len);
    }
    for &(s, e) in &pieces {
        record(dev, pid, s, e, last);
    }
    g.store(&v, tail_owner);
    dev.busy_until.store(busy, Release);
    drop(g);
    match (pieces.first(), pieces.last()) {
        (Some(a), Some(b)) => (a.0, b.1),
        _ => {
            let t = earliest.max(busy);
            (t, t)
        }
    }
}

/// Where this process's next work on device `phys` would start if queued now, ready at `earliest` (an event
/// recorded on a stream stamps it): in the serialised model after all queued work (`busy_until`).
pub(crate) fn next_start(sim: &crate::sim::Sim, phys: usize, earliest: u64) -> u64 {
    let dev = &sim.shared.devices[phys];
    let busy = dev.busy_until.load(Acquire);
    let (Some(sw), Ok(slot)) = (sim.shared.switch_ns(), sim.slot()) else {
        return earliest.max(busy);
    };
    let g = SliceGuard::lock(dev);
    let (mut v, tail_owner) = g.load(now_ns());
    let mut busy = dev.busy_until.load(Acquire);
    drop(g);
    let slicing = sim.shared.slicing(sw);
    let (pieces, _) = place(
        &mut v,
        &mut busy,
        tail_owner,
        slot as u64 + 1,
        earliest,
        1,
        slicing,
    );
    pieces.first().map_or(earliest, |p| p.0)
}

thread_local! {
    /// Per device: the shifts this thread's last `catch_up` had applied (`sleep_until` applies later ones).
    static SEEN: std::cell::Cell<Option<[u64; MAX_DEVICES]>> = const { std::cell::Cell::new(None) };
}

/// The same for the process (its last `catch_up` in any thread): a thread that never made one (a host
/// callback's) starts from it.
static SEEN_PROCESS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// `t`, a time of the process `me` (slot + 1), moved by device `dev`'s shifts `from..to` (those still in its
/// log) that other processes made: its own only ever move work queued after all of its own.
fn shifted(dev: &DeviceState, me: u64, from: u64, to: u64, mut t: u64) -> u64 {
    for i in from.max(to.saturating_sub(SHIFTS as u64))..to {
        let sh = &dev.shifts[(i % SHIFTS as u64) as usize];
        let (at, len) = (sh.at.load(Relaxed), sh.len.load(Relaxed));
        if t > at && sh.owner.load(Relaxed) != me {
            t += len;
        }
    }
    t
}

/// Time-slicing model: moves this process's own times (stream tails and pending kernels, events, ring
/// entries it extends) by the shifts other processes made since it last looked, so a kernel that was switched
/// out ends later for its synchronisation, queries and events. Called under the objects lock (`objects::with`).
pub(crate) fn catch_up(o: &mut crate::objects::Objects) {
    let Some(sim) = crate::sim::loaded() else { return };
    // Only a process with work of its own (never a forked child's or an NVML-only process's first call) looks.
    if sim.shared.switch_ns().is_none() || !crate::sim::cuda_initialised() {
        return;
    }
    let Ok(slot) = sim.slot() else { return };
    let me = slot as u64 + 1;
    let mut seen = o.shifts_seen;
    for (phys, dev) in sim.shared.devices.iter().enumerate().take(sim.cfg.devices.len()) {
        let to = dev.shift_seq.load(Acquire);
        let from = seen[phys];
        if to == from {
            continue;
        }
        let on_dev =
            |o: &crate::objects::Objects, ctx: u64| o.contexts.get(&ctx).is_some_and(|c| c.phys == phys);
        let streams: Vec<u64> = o
            .streams
            .iter()
            .filter(|(_, s)| on_dev(o, s.ctx))
            .map(|(h, _)| *h)
            .collect();
        for h in streams {
            if let Some(s) = o.streams.get_mut(&h) {
                s.tail = shifted(dev, me, from, to, s.tail);
                for e in s.pending.iter_mut() {
                    *e = shifted(dev, me, from, to, *e);
                }
            }
        }
        let events: Vec<u64> = o
            .events
            .iter()
            .filter(|(_, e)| on_dev(o, e.ctx))
            .map(|(h, _)| *h)
            .collect();
        for h in events {
            if let Some(t) = o.events.get_mut(&h).and_then(|e| e.time.as_mut()) {
                *t = shifted(dev, me, from, to, *t);
            }
        }
        if let Some(l) = o.last_interval.get_mut(&phys) {
            l.1 = shifted(dev, me, from, to, l.1);
        }
        seen[phys] = to;
    }
    o.shifts_seen = seen;
    for (g, v) in SEEN_PROCESS.iter().zip(seen) {
        g.store(v, Relaxed);
    }
    SEEN.with(|c| c.set(Some(seen)));
}

/// After sleeping until `t`: the later time it became through shifts since this thread's last `catch_up`.
fn later_by_shifts(t: u64) -> u64 {
    let Some(sim) = crate::sim::loaded() else { return t };
    if sim.shared.switch_ns().is_none() {
        return t;
    }
    let Ok(slot) = sim.slot() else { return t };
    let me = slot as u64 + 1;
    let mut seen = SEEN
        .with(|c| c.get())
        .unwrap_or_else(|| std::array::from_fn(|i| SEEN_PROCESS[i].load(Relaxed)));
    let mut out = t;
    for (phys, dev) in sim.shared.devices.iter().enumerate().take(sim.cfg.devices.len()) {
        let to = dev.shift_seq.load(Acquire);
        out = shifted(dev, me, seen[phys], to, out);
        seen[phys] = to;
    }
    SEEN.with(|c| c.set(Some(seen)));
    out
}

/// Appends (or extends, when it directly follows this process's previous interval) a ring entry.
/// `last` is this process's (ring index, end) of its previous interval on this device.
pub(crate) fn record(dev: &DeviceState, pid: u32, start: u64, end: u64, last: &mut Option<(u64, u64)>) {
    if end == start {
        return;
    }
    if let Some((idx, prev_end)) = *last {
        let e = &dev.ring[(idx % RING as u64) as usize];
        if prev_end == start
            && e.seq.load(Acquire) == 2 * idx + 2
            && e.pid.load(Relaxed) == pid as u64
            && e.end.load(Acquire) == prev_end
        {
            e.end.store(end, Release);
            *last = Some((idx, end));
            return;
        }
    }
    let idx = dev.ring_next.fetch_add(1, AcqRel);
    let e = &dev.ring[(idx % RING as u64) as usize];
    e.seq.store(2 * idx + 1, Release);
    e.pid.store(pid as u64, Relaxed);
    e.start.store(start, Relaxed);
    e.end.store(end, Relaxed);
    e.seq.store(2 * idx + 2, Release);
    *last = Some((idx, end));
}

/// Schedules a kernel: reserves its interval, records it, counts busy time. Returns (start, end).
pub(crate) fn schedule(
    shared: &SharedState,
    phys: usize,
    slot: usize,
    earliest: u64,
    dur: u64,
    last: &mut Option<(u64, u64)>,
) -> (u64, u64) {
    let dev = &shared.devices[phys];
    // Intervals carry the pid NVML reports (the host pid), as do its per-process samples.
    let pid = shared.procs[slot].host_pid.load(Relaxed);
    let (start, end) = match shared.switch_ns() {
        None => {
            let (start, end) = reserve(dev, earliest, dur);
            record(dev, pid, start, end, last);
            (start, end)
        }
        Some(sw) => reserve_sliced(dev, slot, pid, shared.slicing(sw), earliest, dur, last),
    };
    dev.busy_ns.fetch_add(dur, Relaxed);
    shared.procs[slot].busy_ns[phys].fetch_add(dur, Relaxed);
    (start, end)
}

/// Consistent snapshot of the ring: (pid, start, end) of every complete entry overlapping [from, to).
pub(crate) fn intervals(dev: &DeviceState, from: u64, to: u64) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    for e in dev.ring.iter() {
        let s1 = e.seq.load(Acquire);
        if s1 == 0 || s1 % 2 == 1 {
            continue;
        }
        let (pid, start, end) = (e.pid.load(Relaxed), e.start.load(Relaxed), e.end.load(Acquire));
        if e.seq.load(Acquire) != s1 {
            continue;
        }
        if start < to && end > from {
            out.push((pid as u32, start.max(from), end.min(to)));
        }
    }
    out
}

/// Ends `pid`'s intervals on `dev` at `at`: kernels not yet run never run (the process died). The device
/// stays reserved until `busy_until` (idle where the dropped kernels were).
pub(crate) fn cut(dev: &DeviceState, pid: u32, at: u64) {
    for e in dev.ring.iter() {
        let s1 = e.seq.load(Acquire);
        if s1 == 0 || s1 % 2 == 1 || e.pid.load(Relaxed) != u64::from(pid) || e.end.load(Acquire) <= at {
            continue;
        }
        // Same protocol as `record`: odd while rewritten, so readers skip a half-written entry.
        if e.seq.compare_exchange(s1, s1 + 1, AcqRel, Acquire).is_err() {
            continue;
        }
        let start = e.start.load(Relaxed);
        e.end.store(start.max(at), Release);
        let _ = e.seq.compare_exchange(s1 + 1, s1, AcqRel, Acquire);
    }
}

/// Busy ns in [from, to), per pid (`None` = all processes).
pub(crate) fn busy_in(dev: &DeviceState, from: u64, to: u64, pid: Option<u32>) -> u64 {
    intervals(dev, from, to)
        .iter()
        .filter(|(p, _, _)| pid.is_none_or(|x| x == *p))
        .map(|(_, s, e)| e - s)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_model() {
        assert_eq!(kernel_duration([132, 1, 1], 132, 1000), 1000);
        assert_eq!(kernel_duration([133, 1, 1], 132, 1000), 2000);
        assert_eq!(kernel_duration([1, 1, 1], 132, 1000), 1000);
        assert_eq!(kernel_duration([10, 10, 10], 100, 5), 50);
        assert_eq!(kernel_duration([0, 1, 1], 100, 5), 0);
    }

    fn device() -> &'static DeviceState {
        // A zeroed DeviceState (all atomics) on the heap.
        let layout = std::alloc::Layout::new::<DeviceState>();
        // SAFETY: all-zero is a valid DeviceState (atomics only); leaked for the test's lifetime.
        unsafe { &*(std::alloc::alloc_zeroed(layout) as *const DeviceState) }
    }

    #[test]
    fn kernels_serialise_and_merge() {
        let d = device();
        let mut last = None;
        let (s1, e1) = reserve(d, 100, 50);
        record(d, 7, s1, e1, &mut last);
        let (s2, e2) = reserve(d, 0, 50);
        assert_eq!((s2, e2), (150, 200));
        record(d, 7, s2, e2, &mut last);
        // Contiguous intervals of one process share an entry.
        assert_eq!(d.ring_next.load(Relaxed), 1);
        let mut other = None;
        let (s3, e3) = reserve(d, 0, 100);
        record(d, 8, s3, e3, &mut other);
        assert_eq!((s3, e3), (200, 300));
        assert_eq!(busy_in(d, 0, 1000, None), 200);
        assert_eq!(busy_in(d, 0, 1000, Some(7)), 100);
        assert_eq!(busy_in(d, 150, 250, Some(8)), 50);
    }

    const P: Slicing = Slicing {
        quantum: 100,
        switch: 10,
    };

    #[test]
    fn alone_a_process_runs_back_to_back() {
        let (mut v, mut busy) = (Vec::new(), 0);
        let (pieces, shifts) = place(&mut v, &mut busy, 0, 1, 1000, 250, P);
        assert_eq!(pieces, vec![(1000, 1250)]);
        assert!(shifts.is_empty());
        assert_eq!(busy, 1250);
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn a_second_process_gets_the_next_slice_and_switches_cost() {
        let (mut v, mut busy) = (Vec::new(), 0);
        place(&mut v, &mut busy, 0, 1, 1000, 300, P);
        // Process 2 at 1050: in after process 1's running slice, a switch either side; process 1's later work
        // (and its kernel's end) moves by 2 switches + the slice.
        let (pieces, shifts) = place(&mut v, &mut busy, 0, 2, 1050, 60, P);
        assert_eq!(pieces, vec![(1110, 1170)]);
        assert_eq!(shifts, vec![(1100, 80)]);
        assert_eq!(busy, 1380);
        // More work of process 2 fills its slice up to the quantum, then waits for process 1's next slice.
        let (pieces, shifts) = place(&mut v, &mut busy, 0, 2, 1060, 60, P);
        assert_eq!(pieces, vec![(1170, 1210), (1330, 1350)]);
        assert_eq!(shifts, vec![(1170, 40), (1320, 40)]);
        let owners: Vec<u64> = v.iter().map(|s| s.owner).collect();
        assert_eq!(owners, vec![1, 2, 1, 2, 1]);
        assert_eq!(busy, 1460);
        // Device time from 1000: 420 of work and 4 switches of 10.
        assert_eq!(busy - 1000, 420 + 40);
    }

    /// `n` processes that each keep 32 kernels of `kernel` ns queued (compute_loop: batches of 8, four in
    /// flight), each starting 1 ms after the previous, for 2 s of the device on the default quantum and switch:
    /// the work each did and the device time it all took.
    fn busy_processes(n: usize, kernel: u64) -> (Vec<u64>, u64) {
        let p = Slicing {
            quantum: 2_000_000,
            switch: 222_000,
        };
        let (mut v, mut busy) = (Vec::new(), 0u64);
        let mut work = vec![0u64; n];
        let mut tails = vec![0u64; n];
        let mut next: Vec<u64> = (0..n as u64).map(|i| i * 1_000_000).collect();
        let mut ends: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); n];
        let mut iters = 0;
        while busy < 2_000_000_000 {
            iters += 1;
            assert!(iters < 100_000);
            let who = (0..n).min_by_key(|&i| next[i]).unwrap();
            let now = next[who];
            v.retain(|s: &Sl| s.end > now);
            for _ in 0..8 {
                let (pieces, shifts) = place(
                    &mut v,
                    &mut busy,
                    0,
                    who as u64 + 1,
                    now.max(tails[who]),
                    kernel,
                    p,
                );
                tails[who] = pieces.last().unwrap().1;
                // The other processes' times move by the shifts (`catch_up`).
                for (at, len) in shifts {
                    for o in (0..n).filter(|&o| o != who) {
                        for x in ends[o].iter_mut().chain(std::iter::once(&mut tails[o])) {
                            if *x > at {
                                *x += len;
                            }
                        }
                    }
                }
                work[who] += kernel;
            }
            ends[who].push_back(tails[who]);
            next[who] = if ends[who].len() >= 4 {
                ends[who].pop_front().unwrap().max(now)
            } else {
                now
            };
            assert!(v.len() < MAX_SLICES, "{} slices ahead", v.len());
        }
        (work, busy)
    }

    /// Two busy processes: the fraction of the device doing work and each one's share.
    fn busy_pair(kernel: u64) -> (f64, [f64; 2]) {
        let (work, busy) = busy_processes(2, kernel);
        let b = busy as f64;
        (
            (work[0] + work[1]) as f64 / b,
            [work[0] as f64 / b, work[1] as f64 / b],
        )
    }

    /// A busy pair alternates every quantum: 2 / 2.222 of the device does work, half each.
    #[test]
    fn a_busy_pair_loses_one_switch_per_quantum() {
        let (frac, each) = busy_pair(400_000);
        assert!((frac - 2.0 / 2.222).abs() < 0.002, "{frac}");
        assert!(each.iter().all(|x| (x - 1.0 / 2.222).abs() < 0.01), "{each:?}");
    }

    /// Kernels longer than the quantum (5 ms: 160 ms queued each) are switched out every quantum just the same,
    /// however deep the queues: the driver's scheduler does not wait for a kernel or a queue to end.
    #[test]
    fn a_busy_pair_of_long_kernels_with_deep_queues_alternates_every_quantum() {
        let (frac, each) = busy_pair(5_000_000);
        assert!((frac - 2.0 / 2.222).abs() < 0.005, "{frac}");
        assert!(each.iter().all(|x| (x - 1.0 / 2.222).abs() < 0.01), "{each:?}");
    }

    /// A process whose turn comes only after a run of quanta that is not running yet goes in after the run's
    /// first quantum, not after the whole run (round-robin with runs: before, 3 waited for all of 2's run).
    #[test]
    fn a_turn_behind_a_run_comes_after_its_first_quantum() {
        let (mut v, mut busy) = (Vec::new(), 0);
        place(&mut v, &mut busy, 0, 1, 0, 50, P);
        place(&mut v, &mut busy, 0, 2, 0, 1000, P);
        let (pieces, shifts) = place(&mut v, &mut busy, 0, 3, 10, 30, P);
        assert_eq!(pieces, vec![(170, 200)]);
        assert_eq!(shifts, vec![(160, 50)]);
        let owners: Vec<u64> = v.iter().map(|s| s.owner).collect();
        assert_eq!(owners, vec![1, 2, 3, 2]);
        assert_eq!(busy, 1110);
    }

    /// Work of a process with nobody queued after it is one run, however long; another process's work ready
    /// inside it goes in at the run's next quantum boundary.
    #[test]
    fn a_run_is_one_slice_cut_at_the_quantum_boundary() {
        let (mut v, mut busy) = (Vec::new(), 0);
        place(&mut v, &mut busy, 0, 1, 0, 100_000, P);
        assert_eq!(v.len(), 1);
        let (pieces, shifts) = place(&mut v, &mut busy, 0, 2, 5_050, 30, P);
        assert_eq!(pieces, vec![(5_110, 5_140)]);
        assert_eq!(shifts, vec![(5_100, 50)]);
        let owners: Vec<u64> = v.iter().map(|s| s.owner).collect();
        assert_eq!(owners, vec![1, 2, 1]);
        assert_eq!((v[0].end, v[2].start, v[2].end), (5_100, 5_150, 100_050));
    }

    /// Three busy processes take turns in a fixed order, as the driver's runlist does: each does a third of the
    /// work. (A newcomer let in right after the running slice got 1/2, 1/4, 1/4.)
    #[test]
    fn three_busy_processes_take_turns_round_robin() {
        let (work, busy) = busy_processes(3, 400_000);
        let total = work.iter().sum::<u64>() as f64;
        for w in &work {
            assert!((*w as f64 / total - 1.0 / 3.0).abs() < 0.01, "{work:?}");
        }
        let frac = total / busy as f64;
        assert!((frac - 2.0 / 2.222).abs() < 0.003, "{frac}");
    }

    #[test]
    fn idle_time_absorbs_a_switch() {
        let (mut v, mut busy) = (Vec::new(), 0);
        place(&mut v, &mut busy, 0, 1, 0, 50, P);
        let (pieces, _) = place(&mut v, &mut busy, 0, 2, 55, 10, P);
        assert_eq!(pieces, vec![(60, 70)]);
        let (pieces, _) = place(&mut v, &mut busy, 0, 1, 500, 10, P);
        assert_eq!(pieces, vec![(500, 510)]);
    }

    #[test]
    fn a_full_slice_list_grows_the_last_slice() {
        let (mut v, mut busy) = (Vec::new(), 0);
        let long = 100 * MAX_SLICES as u64;
        place(&mut v, &mut busy, 0, 1, 0, long, P);
        let (pieces, _) = place(&mut v, &mut busy, 0, 2, 0, long, P);
        assert_eq!(pieces.iter().map(|(s, e)| e - s).sum::<u64>(), long);
        assert!(v.len() <= MAX_SLICES && v.len() + 3 > MAX_SLICES, "{}", v.len());
        assert_eq!(v.last().unwrap().owner, 2);
        assert!(busy >= 2 * long);
    }

    #[test]
    fn shifts_move_later_times_only() {
        let d = device();
        let mut last = None;
        record(d, 7, 0, 100, &mut last);
        record(d, 7, 100, 300, &mut last);
        apply_shift(d, 2, 200, 50);
        // The straddling interval is cut at 200 and its rest moved.
        assert_eq!(busy_in(d, 0, 1000, Some(7)), 300);
        assert_eq!(busy_in(d, 200, 250, Some(7)), 0);
        assert_eq!(busy_in(d, 250, 350, Some(7)), 100);
        assert_eq!(shifted(d, 1, 0, 1, 200), 200);
        assert_eq!(shifted(d, 1, 0, 1, 201), 251);
        // The process that made the shift does not move its own times by it.
        assert_eq!(shifted(d, 2, 0, 1, 201), 201);
        // The process's own `last` no longer matches the entry: the next interval does not extend it.
        record(d, 7, 300, 310, &mut last);
        assert_eq!(busy_in(d, 0, 1000, Some(7)), 310);
    }
}
