//! The device timeline: when each kernel runs.
//!
//! A kernel takes `waves × ns_per_wave`, waves = ⌈blocks / SMs⌉. Kernels run one at a time per device across
//! every process sharing the state file (time-slicing): a launch starts at max(now, its stream's tail, the
//! device's `busy_until`) and advances `busy_until` with a CAS loop, so concurrent launchers from any process
//! queue up without a lock. Each interval goes into the device's ring (for NVML utilisation) and its length
//! into the per-process and per-device busy counters. Time is CLOCK_MONOTONIC in ns; waits sleep.

use std::sync::atomic::Ordering::*;

use crate::state::{DeviceState, SharedState, RING};

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

/// Sleeps (never spins) until CLOCK_MONOTONIC reaches `t`.
pub(crate) fn sleep_until(t: u64) {
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
    let mut cur = dev.busy_until.load(Acquire);
    loop {
        let start = earliest.max(cur);
        let end = start + dur;
        match dev.busy_until.compare_exchange_weak(cur, end, AcqRel, Acquire) {
            Ok(_) => return (start, end),
            Err(v) => cur = v,
        }
    }
}

/// Appends (or extends, when it directly follows this process's previous interval) a ring entry.
/// `last` is this process's (ring index, end) of its previous interval on this device.
pub(crate) fn record(dev: &DeviceState, pid: u32, start: u64, end: u64, last: &mut Option<(u64, u64)>) {
    if end == start {
        return;
    }
    if let Some((idx, prev_end)) = *last {
        let e = &dev.ring[(idx % RING as u64) as usize];
        if prev_end == start && e.seq.load(Acquire) == 2 * idx + 2 && e.pid.load(Relaxed) == pid as u64 {
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
    let (start, end) = reserve(dev, earliest, dur);
    // Intervals carry the pid NVML reports (the host pid), as do its per-process samples.
    record(dev, shared.procs[slot].host_pid.load(Relaxed), start, end, last);
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
}
