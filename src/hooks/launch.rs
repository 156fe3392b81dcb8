//! Every path that puts work on the GPU goes through the SM-time throttle (`src/throttle`).
//!
//! Paths: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel (each also `_ptsz`),
//! cuLaunchCooperativeKernelMultiDevice, cuGraphLaunch (+ `_ptsz`), legacy cuLaunch / cuLaunchGrid /
//! cuLaunchGridAsync. Whether the program reaches them by symbol, `dlsym` or `cuGetProcAddress`, it lands here
//! (the exports and the proc-address map point at these hooks).
//!
//! Each hook: when no SM or memory limit can apply (the common case), the export already forwarded the call
//! (`abi::launch_unhooked`), or the hook makes one check and the real call (a limits file changed: re-read). Otherwise
//! the launch is keyed (function, grid, block — or the graph), admitted by the throttle (which may sleep), sometimes
//! measured with events on its stream, then made. With a memory cap, a function's first launch in its stream's
//! context is admitted inside the throttle's call, after its wait, and measured once the throttle returned
//! (`FirstUse::first_launch`: lazy loading, stack growth). A `_ptsz` call with the NULL stream runs on the per-thread
//! default stream, so its probe events are recorded on `CU_STREAM_PER_THREAD`.

use super::probe_stream;
use crate::ffi::cuda::*;
use crate::memory::{ExecCall, Launch, Use};
use crate::state::Shim;
use crate::throttle::estimate::graph_key;
use crate::throttle::kernel_key;
use std::ffi::{c_int, c_uint};

/// `cuLaunchKernel`, `cuLaunchCooperativeKernel` (each also `_ptsz`) and legacy `cuLaunch` (a 1×1 grid, block
/// shape from cuFuncSetBlockShape, legacy NULL stream).
#[inline]
pub(crate) fn kernel(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if !s.devices.launch_hooked() {
        return call();
    }
    let probe = probe_stream(stream, ds);
    if s.mem.elastic().on() {
        // A move closure made here: had the cold call taken `grid` and `block` by value, the launch's own
        // copies would escape and be stored on every launch (+5 instructions, elastic off).
        let hooked = move || kernel_hooked(s, call, f, grid, block, probe);
        return s.mem.elastic().call(&s.cuda, &[probe], hooked);
    }
    kernel_hooked(s, call, f, grid, block, probe)
}

#[inline(always)]
fn kernel_hooked(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    probe: usize,
) -> CUresult {
    s.devices.hami_pre_launch();
    if s.mem.first_use().armed() {
        let mut first = None;
        let r = throttled(s, f, grid, block, probe, || {
            first_use(s, Use::Launch, f as usize, probe, &mut first, call)
        });
        if let Some(l) = first {
            s.mem.first_use().launched(&s.cuda, &s.nvml, l, probe, r);
        }
        return r;
    }
    throttled(s, f, grid, block, probe, call)
}

#[inline(always)]
fn throttled(
    s: &Shim,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    probe: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if s.throttle.active() {
        let key = kernel_key(f, grid, block);
        s.throttle.launch(&s.cuda, &s.nvml, key, probe, call)
    } else {
        call()
    }
}

/// The real launch of `f` (a function, kernel or graph exec) on `stream`, after the throttle let it go, while a
/// memory cap applies: its first launch in the stream's context is admitted (`FirstUse::first_launch`: its code
/// may load now, its stack grow) and left in `first` for the caller to measure once the throttle (and a graph's
/// memory) settled (`FirstUse::launched`). Inside the throttle's call, so that a first use holds the gate only
/// across the driver's call and what follows it, never across the throttle's wait.
#[inline]
fn first_use<'a>(
    s: &'a Shim,
    how: Use,
    f: usize,
    stream: usize,
    first: &mut Option<Launch<'a>>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if s.mem
        .first_use()
        .launch_to(&s.cuda, &s.nvml, how, f, stream, first)
    {
        call()
    } else {
        CUresult::ERROR_OUT_OF_MEMORY
    }
}

/// Legacy `cuLaunchGrid` (legacy NULL stream) and `cuLaunchGridAsync`.
pub(crate) fn grid(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    w: c_int,
    h: c_int,
    stream: CUstream,
) -> CUresult {
    let grid = [w.max(0) as c_uint, h.max(0) as c_uint, 1];
    kernel(s, call, f, grid, [0, 0, 0], stream, DefaultStream::Legacy)
}

/// `cuLaunchKernelEx` (+ `_ptsz`): grid, block and stream from the `CUlaunchConfig`.
///
/// # Safety
/// `config` is NULL or points to a `CUlaunchConfig` (the driver's contract).
pub(crate) unsafe fn kernel_ex(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    config: *const CUlaunchConfig,
    f: CUfunction,
    ds: DefaultStream,
) -> CUresult {
    if config.is_null() {
        return call();
    }
    // SAFETY: non-NULL, a CUlaunchConfig by the caller's contract.
    let c = unsafe { &*config };
    let grid = [c.gridDimX, c.gridDimY, c.gridDimZ];
    let block = [c.blockDimX, c.blockDimY, c.blockDimZ];
    kernel(s, call, f, grid, block, c.hStream, ds)
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported): every device in the list is charged
/// (each entry's stream belongs to its device's context).
///
/// # Safety
/// `list` points to `num_devices` `CUDA_LAUNCH_PARAMS` (the driver's contract).
pub(crate) unsafe fn multi_device(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
) -> CUresult {
    if !s.devices.launch_hooked() || list.is_null() || num_devices == 0 || num_devices > 64 {
        return call();
    }
    // SAFETY: the driver contract: `list` points to `num_devices` CUDA_LAUNCH_PARAMS.
    let entries = unsafe { std::slice::from_raw_parts(list, num_devices as usize) };
    if s.mem.elastic().on() {
        let streams: Vec<usize> = entries
            .iter()
            .map(|e| probe_stream(e.hStream, DefaultStream::Legacy))
            .collect();
        return s
            .mem
            .elastic()
            .call(&s.cuda, &streams, || multi_hooked(s, call, entries));
    }
    multi_hooked(s, call, entries)
}

fn multi_hooked(s: &Shim, call: impl FnOnce() -> CUresult, entries: &[CUDA_LAUNCH_PARAMS]) -> CUresult {
    let mut firsts = Vec::new();
    let r = multi_throttled(s, || multi_first_use(s, call, entries, &mut firsts), entries);
    for (l, stream) in firsts {
        s.mem.first_use().launched(&s.cuda, &s.nvml, l, stream, r);
    }
    r
}

/// [`first_use`] for each entry of a multi-device launch (each in its stream's context), before the one call;
/// left in `firsts` for the caller to measure.
fn multi_first_use<'a>(
    s: &'a Shim,
    call: impl FnOnce() -> CUresult,
    entries: &[CUDA_LAUNCH_PARAMS],
    firsts: &mut Vec<(Launch<'a>, usize)>,
) -> CUresult {
    if s.mem.first_use().armed() {
        for e in entries {
            let stream = probe_stream(e.hStream, DefaultStream::Legacy);
            // Two entries' first uses on one device would each be admitted before either is measured; the
            // driver takes "one per device".
            let mut first = None;
            let f = e.function as usize;
            if !s
                .mem
                .first_use()
                .launch_to(&s.cuda, &s.nvml, Use::Launch, f, stream, &mut first)
            {
                return CUresult::ERROR_OUT_OF_MEMORY;
            }
            let Some(l) = first else { continue };
            let twice = firsts.iter().any(|(f, _)| f.same_device(&l));
            firsts.push((l, stream));
            if twice {
                return CUresult::ERROR_INVALID_DEVICE;
            }
        }
    }
    call()
}

fn multi_throttled(s: &Shim, call: impl FnOnce() -> CUresult, entries: &[CUDA_LAUNCH_PARAMS]) -> CUresult {
    let t = &s.throttle;
    if !t.active() {
        return call();
    }
    let mut parts = Vec::with_capacity(entries.len());
    for e in entries {
        // Each entry's stream lives in its device's context.
        let stream = probe_stream(e.hStream, DefaultStream::Legacy);
        let grid = [e.gridDimX, e.gridDimY, e.gridDimZ];
        let block = [e.blockDimX, e.blockDimY, e.blockDimZ];
        parts.push((
            t.stream_device(&s.cuda, stream),
            kernel_key(e.function, grid, block),
            stream,
        ));
    }
    t.launch_multi(&s.cuda, &s.nvml, &parts, call)
}

/// `cuGraphLaunch` (+ `_ptsz`): graph memory nodes are admitted around the whole launch (one lock-free probe for
/// graphs without them); the graph is throttled as one unit.
#[inline]
pub(crate) fn graph(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if s.mem.elastic().on() {
        let probe = probe_stream(stream, ds);
        return s
            .mem
            .elastic()
            .call(&s.cuda, &[probe], move || graph_hooked(s, call, exec, stream, ds));
    }
    graph_hooked(s, call, exec, stream, ds)
}

#[inline(always)]
fn graph_hooked(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    // A graph exec's first launch in a context while a memory cap applies: its kernels' code and stack are taken
    // now (refused over the cap, measured after).
    // Measured after `graph_memory` settled the graph's memory nodes: before, their provisional charge would
    // read as the driver's and the load as smaller (found by a review: 1210 MiB under a 1 GiB cap).
    if s.mem.first_use().armed() {
        let probe = probe_stream(stream, ds);
        let mut first = None;
        let r = graph_memory(
            s,
            || first_use(s, Use::Graph, exec as usize, probe, &mut first, call),
            exec,
            stream,
            ds,
        );
        if let Some(l) = first {
            s.mem.first_use().launched(&s.cuda, &s.nvml, l, probe, r);
        }
        return r;
    }
    graph_memory(s, call, exec, stream, ds)
}

#[inline]
fn graph_memory(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    s.mem.graph_exec(&s.cuda, &s.nvml, exec, ExecCall::Launch, || {
        graph_throttled(s, exec, stream, ds, call)
    })
}

#[inline]
fn graph_throttled(
    s: &Shim,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !s.throttle.active() {
        return call();
    }
    s.devices.hami_pre_launch();
    s.throttle.launch(
        &s.cuda,
        &s.nvml,
        graph_key(exec as usize),
        probe_stream(stream, ds),
        call,
    )
}
