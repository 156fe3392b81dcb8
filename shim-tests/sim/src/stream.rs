//! Streams and events on top of the device timeline.
//!
//! A stream is a tail time (when its last queued kernel ends) plus the end times of its pending kernels
//! (at most 1024: a full queue makes the launching thread sleep until the oldest completes, like a real
//! driver's pushbuffer). The NULL / legacy stream of a context also orders with every blocking stream of
//! that context. Events capture their stream's tail; querying compares with now, synchronising sleeps.
//! A stream-ordered wait for a value in memory (cuStreamWaitValue32/64) holds back everything queued after it
//! until the value is there (written by the host, another stream's cuStreamWriteValue*, anything): the kernels
//! behind it wait unscheduled, still counting towards the full queue, so a launch onto such a stream blocks
//! until another thread writes the value, as on a real GPU.

use std::collections::VecDeque;

use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::timeline::{self, now_ns};
use crate::types::*;

/// Most kernels a stream holds before a launch blocks.
pub(crate) const MAX_PENDING: usize = 1024;

/// A graph being captured from a stream.
pub(crate) struct Capture {
    pub graph: u64,
    /// The node new work depends on.
    pub last_node: Option<u64>,
    pub id: u64,
}

/// One stream.
pub(crate) struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    /// When the last work queued on this stream ends (CLOCK_MONOTONIC ns).
    pub tail: u64,
    /// End times of kernels that may not have completed yet, oldest first.
    pub pending: VecDeque<u64>,
    pub capture: Option<Capture>,
    /// Whether this is the context's NULL stream.
    pub is_null: bool,
    /// Work held back by a wait for a value, in order (empty: nothing waits).
    pub held: VecDeque<Held>,
    /// Whether the stream's last work is a copy on a copy engine (an event recorded after it completes with
    /// the copy, not in the kernels' queue).
    pub engine_tail: bool,
}

/// Work a stream holds back behind a [`Held::Wait`].
pub(crate) enum Held {
    /// cuStreamWaitValue32/64: `addr` compared with `value` (`CU_STREAM_WAIT_VALUE_*` in `flags`).
    Wait {
        addr: u64,
        value: u64,
        flags: u32,
        wide: bool,
    },
    /// Kernels of these durations on device `phys`.
    Kernels { phys: usize, durations: Vec<u64> },
}

/// Whether the wait's condition holds now (a word no longer readable, as a VMM range being remapped: not yet).
fn satisfied(o: &Objects, addr: u64, value: u64, flags: u32, wide: bool) -> bool {
    if !word(o, addr, wide, false) {
        return false;
    }
    // SAFETY: simulated device memory is host memory, and the word was just found readable (an allocation, or a
    // VMM mapping with read access).
    let v = unsafe {
        if wide {
            std::ptr::read_volatile(addr as *const u64)
        } else {
            std::ptr::read_volatile(addr as *const u32) as u64
        }
    };
    let mask = if wide { u64::MAX } else { u32::MAX as u64 };
    match flags & 0x3 {
        0 if wide => v >= value,
        0 => (v as u32).wrapping_sub(value as u32) as i32 >= 0, // GEQ: cyclic, as the driver compares
        1 => v == value & mask,
        2 => v & value & mask != 0,
        _ => !(v | value) & mask != 0,
    }
}

/// Lets go of what a stream held back whose wait is satisfied now. Returns whether anything is still held.
pub(crate) fn settle(o: &mut Objects, sim: &Sim, s: u64) -> CuResult<bool> {
    loop {
        let Some(st) = o.streams.get_mut(&s) else {
            return Ok(false);
        };
        match st.held.front() {
            None => return Ok(false),
            Some(&Held::Wait {
                addr,
                value,
                flags,
                wide,
            }) => {
                if !satisfied(o, addr, value, flags, wide) {
                    return Ok(true);
                }
                let st = o.streams.get_mut(&s).expect("looked up above");
                st.held.pop_front();
                st.tail = st.tail.max(now_ns());
            }
            Some(Held::Kernels { .. }) => {
                let Some(Held::Kernels { phys, durations }) = st.held.pop_front() else {
                    unreachable!()
                };
                schedule(o, sim, s, phys, &durations)?;
            }
        }
    }
}

/// Whether stream `s` holds work back behind an unsatisfied wait (after letting go of what it can).
pub(crate) fn blocked(o: &mut Objects, sim: &Sim, s: u64) -> bool {
    settle(o, sim, s).unwrap_or(false)
}

/// Whether some stream of context `ctx` holds work back.
pub(crate) fn ctx_blocked(o: &mut Objects, sim: &Sim, ctx: u64) -> bool {
    let mine: Vec<u64> = o
        .streams
        .iter()
        .filter(|(_, x)| x.ctx == ctx)
        .map(|(&h, _)| h)
        .collect();
    mine.into_iter().fold(false, |b, s| blocked(o, sim, s) | b)
}

/// Whether a 4- (or 8-, `wide`) byte word at `addr` lies aligned inside a live allocation, or in a VMM mapping
/// with read (`write`: read-write) access, as the driver takes stream memory operations on either.
pub(crate) fn word(o: &Objects, addr: u64, wide: bool, write: bool) -> bool {
    let size = if wide { 8 } else { 4 };
    addr.is_multiple_of(size)
        && (o
            .mem
            .allocs
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, a)| addr + size <= base + a.size)
            || o.vmm.kernel_access(addr, size, write, None))
}

/// cuStreamWaitValue32/64: work queued on `s` after this waits until the value at `addr` satisfies `flags`.
pub(crate) fn wait_value(
    o: &mut Objects,
    s: u64,
    addr: u64,
    value: u64,
    flags: u32,
    wide: bool,
) -> CuResult<()> {
    if !word(o, addr, wide, false) || flags & !0x3 & !(1 << 30) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let st = o.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.held.push_back(Held::Wait {
        addr,
        value,
        flags,
        wide,
    });
    Ok(())
}

/// One event.
pub(crate) struct Event {
    pub ctx: u64,
    pub flags: u32,
    /// When the recorded work completes; `None` until recorded.
    pub time: Option<u64>,
    /// Shared with other processes (`ipc`): the address of the 8-byte memfd mapping holding the completion
    /// time every process sees (0 = never recorded), and our memfd (-1 in an importer).
    pub ipc: Option<(usize, i32)>,
}

/// Creates a stream in `ctx` (the first one a context gets is its NULL stream).
pub(crate) fn create(o: &mut Objects, ctx: u64, flags: u32, priority: i32) -> u64 {
    let h = new_handle(Kind::Stream);
    let is_null = o.contexts.get(&ctx).is_some_and(|c| c.null_stream == 0);
    o.streams.insert(
        h,
        Stream {
            ctx,
            flags,
            priority,
            tail: 0,
            pending: VecDeque::new(),
            capture: None,
            is_null,
            held: VecDeque::new(),
            engine_tail: false,
        },
    );
    h
}

/// The stream a handle means: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the current context's
/// default stream (the per-thread stream is modelled by the same one: kernels serialise per device anyway).
pub(crate) fn resolve(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<u64> {
    if h == 0 || h == CU_STREAM_LEGACY as u64 || h == CU_STREAM_PER_THREAD as u64 {
        let ctx = crate::context::current(o, sim)?;
        return Ok(o.contexts[&ctx].null_stream);
    }
    let ctx = o.streams.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?.ctx;
    crate::context::resolve(o, sim, ctx)?;
    Ok(h)
}

/// cuStreamDestroy. The NULL stream cannot be destroyed.
pub(crate) fn destroy(o: &mut Objects, h: u64) -> CuResult<()> {
    match o.streams.get(&h) {
        Some(s) if !s.is_null => {
            o.streams.remove(&h);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Drops the streams and events of a context being torn down.
pub(crate) fn destroy_for_context(o: &mut Objects, ctx: u64) {
    o.streams.retain(|_, s| s.ctx != ctx);
    o.events.retain(|_, e| e.ctx != ctx);
}

/// When everything queued so far on stream `s` is done: its tail, and for the NULL stream also the tails
/// of the context's blocking streams (legacy default-stream semantics).
pub(crate) fn done_time(o: &Objects, s: u64) -> u64 {
    let Some(st) = o.streams.get(&s) else { return 0 };
    if !st.is_null {
        return st.tail;
    }
    o.streams
        .values()
        .filter(|x| x.ctx == st.ctx && (x.is_null || x.flags & CU_STREAM_NON_BLOCKING == 0))
        .map(|x| x.tail)
        .max()
        .unwrap_or(0)
}

/// The earliest new work on `s` may start: after the stream's own work, and for a blocking stream after
/// the NULL stream's work (and the NULL stream after all blocking streams').
fn earliest(o: &Objects, s: u64) -> u64 {
    let st = &o.streams[&s];
    if st.is_null {
        return done_time(o, s);
    }
    let mut t = st.tail;
    if st.flags & CU_STREAM_NON_BLOCKING == 0 {
        if let Some(c) = o.contexts.get(&st.ctx) {
            t = t.max(o.streams.get(&c.null_stream).map_or(0, |n| n.tail));
        }
    }
    t
}

/// When everything in context `ctx` is done.
pub(crate) fn ctx_done_time(o: &Objects, ctx: u64) -> u64 {
    o.streams
        .values()
        .filter(|s| s.ctx == ctx)
        .map(|s| s.tail)
        .max()
        .unwrap_or(0)
}

/// Queues kernels of the given durations on stream `s` (device `phys`). Returns `Some(t)` without queueing
/// anything when the stream's queue is full: the caller drops the lock, sleeps until `t` and retries.
pub(crate) fn enqueue(
    o: &mut Objects,
    sim: &Sim,
    s: u64,
    phys: usize,
    durations: &[u64],
) -> CuResult<Option<u64>> {
    let now = now_ns();
    let held = settle(o, sim, s)?;
    {
        let st = o.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        while st.pending.front().is_some_and(|&e| e <= now) {
            st.pending.pop_front();
        }
        let behind: usize = st
            .held
            .iter()
            .map(|h| match h {
                Held::Kernels { durations, .. } => durations.len(),
                Held::Wait { .. } => 0,
            })
            .sum();
        if st.pending.len() + behind + durations.len().min(MAX_PENDING) > MAX_PENDING {
            // Behind a wait: look again soon (the value may be written any time).
            return Ok(Some(if held {
                now + 1_000_000
            } else {
                st.pending.front().copied().unwrap_or(now)
            }));
        }
        if held {
            st.held.push_back(Held::Kernels {
                phys,
                durations: durations.to_vec(),
            });
            return Ok(None);
        }
    }
    schedule(o, sim, s, phys, durations)?;
    Ok(None)
}

/// Queues a copy of `dur` ns on stream `s` on copy engine `engine` of device `phys` (0: host to device, 1:
/// device to host): after the stream's earlier work and the engine's queued copies, next to the kernels. Behind
/// a wait for a value it goes on the device timeline instead (a simplification). `Some(t)`: queue full, as
/// `enqueue`.
pub(crate) fn enqueue_copy(
    o: &mut Objects,
    sim: &Sim,
    s: u64,
    phys: usize,
    engine: usize,
    dur: u64,
) -> CuResult<Option<u64>> {
    if settle(o, sim, s)? {
        return enqueue(o, sim, s, phys, &[dur]);
    }
    let now = now_ns();
    let start = earliest(o, s).max(now);
    let st = o.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    while st.pending.front().is_some_and(|&e| e <= now) {
        st.pending.pop_front();
    }
    if st.pending.len() >= MAX_PENDING {
        return Ok(Some(st.pending.front().copied().unwrap_or(now)));
    }
    let (_, end) = timeline::reserve_on(&sim.shared.devices[phys].engine_until[engine], start, dur);
    st.tail = st.tail.max(end);
    st.pending.push_back(end);
    st.engine_tail = true;
    Ok(None)
}

/// Puts kernels of the given durations on stream `s`'s timeline (device `phys`).
fn schedule(o: &mut Objects, sim: &Sim, s: u64, phys: usize, durations: &[u64]) -> CuResult<()> {
    let now = now_ns();
    let slot = sim.slot()?;
    let mut earliest = earliest(o, s).max(now);
    let mut last = o.last_interval.get(&phys).copied();
    let mut ends = Vec::with_capacity(durations.len());
    for &dur in durations {
        let (_, end) = timeline::schedule(sim.shared, phys, slot, earliest, dur, &mut last);
        earliest = end;
        ends.push(end);
    }
    if let Some(l) = last {
        o.last_interval.insert(phys, l);
    }
    let st = o.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.engine_tail = false;
    for end in ends {
        st.tail = st.tail.max(end);
        st.pending.push_back(end);
    }
    Ok(())
}

/// cuStreamWaitEvent: later work on `s` starts after the event's work.
pub(crate) fn wait_event(o: &mut Objects, s: u64, ev: u64) -> CuResult<()> {
    let t = crate::ipc::event_time(o.events.get(&ev).ok_or(CUDA_ERROR_INVALID_HANDLE)?).unwrap_or(0);
    let st = o.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.tail = st.tail.max(t);
    Ok(())
}

/// cuEventCreate.
pub(crate) fn event_create(o: &mut Objects, ctx: u64, flags: u32) -> u64 {
    let h = new_handle(Kind::Event);
    o.events.insert(
        h,
        Event {
            ctx,
            flags,
            time: None,
            ipc: None,
        },
    );
    h
}

/// cuEventRecord: the event completes when the work queued on `s` so far does (or now, if idle).
pub(crate) fn event_record(o: &mut Objects, ev: u64, s: u64) -> CuResult<()> {
    let t = done_time(o, s).max(now_ns());
    let e = o.events.get_mut(&ev).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    e.time = Some(t);
    crate::ipc::publish(e);
    Ok(())
}

/// Time-slicing: an event recorded on a stream is executed when the device reaches it in its one-at-a-time
/// queue, i.e. not before the work other processes queued on the device before it (a real GPU runs the event
/// in the context's time slice, right before that context's next kernel). So a start event recorded just
/// before a launch stamps when that kernel really starts, and elapsed(start, end) is the kernel's own device
/// time even when other processes' kernels are queued ahead of it. With one process on the device
/// `busy_until` is its own tail: nothing changes.
pub(crate) fn event_at_device_position(o: &mut Objects, sim: &crate::sim::Sim, ev: u64, s: u64) {
    let Some(ctx) = o.streams.get(&s).filter(|st| !st.engine_tail).map(|st| st.ctx) else {
        return;
    };
    let Ok((_, phys)) = crate::context::device_of(o, ctx) else {
        return;
    };
    if let Some(e) = o.events.get_mut(&ev) {
        if let Some(t) = e.time.as_mut() {
            *t = crate::timeline::next_start(sim, phys, *t);
        }
        crate::ipc::publish(e);
    }
}

/// cuEventElapsedTime in ms.
pub(crate) fn elapsed_ms(o: &Objects, start: u64, end: u64) -> CuResult<f32> {
    let a = o.events.get(&start).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let b = o.events.get(&end).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (Some(ta), Some(tb)) = (a.time, b.time) else {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    };
    if ta.max(tb) > now_ns() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    Ok((tb as f64 - ta as f64) as f32 / 1e6)
}

/// Fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when `s` is capturing (synchronising it is illegal),
/// invalidating the capture like a real driver.
pub(crate) fn check_not_capturing(o: &mut Objects, s: u64) -> CuResult<()> {
    if let Some(st) = o.streams.get_mut(&s) {
        if st.capture.is_some() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
    }
    Ok(())
}
