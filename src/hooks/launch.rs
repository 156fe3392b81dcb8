//! Every path that puts work on the GPU goes through the SM-time throttle (`src/throttle`).
//!
//! Paths: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel (each also `_ptsz`),
//! cuLaunchCooperativeKernelMultiDevice, cuGraphLaunch (+ `_ptsz`), legacy cuLaunch / cuLaunchGrid /
//! cuLaunchGridAsync. Whether the program reaches them by symbol, `dlsym` or `cuGetProcAddress`, it lands here
//! (the exports and the proc-address map point at these hooks).
//!
//! Each hook: when no SM limit can apply (the common case), one check and the real call. Otherwise the launch
//! is keyed (function, grid, block — or the graph), admitted by the throttle (which may sleep), sometimes
//! measured with events on its stream, then made. A `_ptsz` call with the NULL stream runs on the per-thread
//! default stream, so its probe events are recorded on `CU_STREAM_PER_THREAD`.

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::ffi::cuda::*;
use crate::state::Shim;
use crate::throttle::estimate::launch_key;
use crate::throttle::kernel_key;
use crate::throttle::probe::{STREAM_LEGACY, STREAM_PER_THREAD};
use std::ffi::{c_int, c_uint, c_void};

/// The first fields of `CUlaunchConfig` (cuda.h): grid, block, shared memory, stream.
#[repr(C)]
struct LaunchConfigHead {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
}

/// `CUDA_LAUNCH_PARAMS` (cuda.h).
#[repr(C)]
struct LaunchParams {
    function: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
}

/// Stream for probe events: a `_ptsz` launch on the NULL stream uses the per-thread default stream.
#[inline]
fn probe_stream(stream: CUstream, ptsz: bool) -> usize {
    match (stream as usize, ptsz) {
        (0, true) => STREAM_PER_THREAD,
        (0, false) => STREAM_LEGACY,
        (s, _) => s,
    }
}

#[inline]
fn kernel(
    s: &Shim,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !s.throttle.active() {
        return call();
    }
    let key = kernel_key(f, grid, block);
    s.throttle
        .launch(&s.cuda, &s.nvml, key, probe_stream(stream, ptsz), call)
}

/// Hook of `cuLaunchKernel`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchKernel(
    s: &Shim,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(s, f, [gx, gy, gz], [bx, by, bz], stream, false, || {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe {
            s.cuda
                .cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        }
    })
}

/// Hook of `cuLaunchKernel_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchKernel_ptsz(
    s: &Shim,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(s, f, [gx, gy, gz], [bx, by, bz], stream, true, || {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe {
            s.cuda
                .cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        }
    })
}

/// Grid, block and stream of a `CUlaunchConfig`, if readable.
///
/// # Safety
/// `config` is NULL or points to a `CUlaunchConfig`.
unsafe fn config_head(config: *const CUlaunchConfig) -> Option<([c_uint; 3], [c_uint; 3], CUstream)> {
    let c = config as *const LaunchConfigHead;
    // SAFETY: non-NULL per the check; the driver contract says it points to a CUlaunchConfig, whose first
    // fields have exactly this layout.
    (!c.is_null()).then(|| unsafe { ((*c).grid, (*c).block, (*c).stream) })
}

/// Hook of `cuLaunchKernelEx`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchKernelEx(
    s: &Shim,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: caller's contract.
    let call = || unsafe { s.cuda.cuLaunchKernelEx(config, f, params, extra) };
    // SAFETY: caller's contract on `config`.
    match unsafe { config_head(config) } {
        Some((g, b, st)) => kernel(s, f, g, b, st, false, call),
        None => call(),
    }
}

/// Hook of `cuLaunchKernelEx_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchKernelEx_ptsz(
    s: &Shim,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: caller's contract.
    let call = || unsafe { s.cuda.cuLaunchKernelEx_ptsz(config, f, params, extra) };
    // SAFETY: caller's contract on `config`.
    match unsafe { config_head(config) } {
        Some((g, b, st)) => kernel(s, f, g, b, st, true, call),
        None => call(),
    }
}

/// Hook of `cuLaunchCooperativeKernel`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchCooperativeKernel(
    s: &Shim,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    kernel(s, f, [gx, gy, gz], [bx, by, bz], stream, false, || {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe {
            s.cuda
                .cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)
        }
    })
}

/// Hook of `cuLaunchCooperativeKernel_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchCooperativeKernel_ptsz(
    s: &Shim,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    kernel(s, f, [gx, gy, gz], [bx, by, bz], stream, true, || {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe {
            s.cuda
                .cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params)
        }
    })
}

/// Hook of `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported): every device in the list is
/// charged (each entry's stream belongs to its device's context).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchCooperativeKernelMultiDevice(
    s: &Shim,
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: caller's contract.
    let call = || unsafe {
        s.cuda
            .cuLaunchCooperativeKernelMultiDevice(list, num_devices, flags)
    };
    let t = &s.throttle;
    if !t.active() || list.is_null() || num_devices == 0 || num_devices > 64 {
        return call();
    }
    // SAFETY: the driver contract: `list` points to `num_devices` CUDA_LAUNCH_PARAMS.
    let entries = unsafe { std::slice::from_raw_parts(list as *const LaunchParams, num_devices as usize) };
    let mut parts = Vec::with_capacity(entries.len());
    for e in entries {
        // Each entry's stream lives in its device's context.
        if let Some(ord) = t.stream_device(&s.cuda, e.stream as usize) {
            parts.push((
                ord,
                kernel_key(e.function, e.grid, e.block),
                probe_stream(e.stream, false),
            ));
        }
    }
    t.launch_multi(&s.cuda, &s.nvml, &parts, call)
}

#[inline]
fn graph(
    s: &Shim,
    exec: CUgraphExec,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // Graph memory nodes (one lock-free probe for graphs without them): admitted around the whole launch.
    if s.mem.graph.has_memory(exec as usize) {
        return super::graph_memory::with_graph_memory(s, exec, || {
            graph_throttled(s, exec, stream, ptsz, call)
        });
    }
    graph_throttled(s, exec, stream, ptsz, call)
}

#[inline]
fn graph_throttled(
    s: &Shim,
    exec: CUgraphExec,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !s.throttle.active() {
        return call();
    }
    // A graph is charged as one unit: its estimate is what its launches measured (all of its nodes).
    let key = launch_key(exec as usize, u64::MAX, 0x0067_7261_7068);
    s.throttle
        .launch(&s.cuda, &s.nvml, key, probe_stream(stream, ptsz), call)
}

/// Hook of `cuGraphLaunch`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGraphLaunch(s: &Shim, exec: CUgraphExec, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged under the caller's contract.
    graph(s, exec, stream, false, || unsafe {
        s.cuda.cuGraphLaunch(exec, stream)
    })
}

/// Hook of `cuGraphLaunch_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGraphLaunch_ptsz(s: &Shim, exec: CUgraphExec, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged under the caller's contract.
    graph(s, exec, stream, true, || unsafe {
        s.cuda.cuGraphLaunch_ptsz(exec, stream)
    })
}

/// Hook of legacy `cuLaunch` (a 1×1 grid, block shape from cuFuncSetBlockShape, legacy NULL stream).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunch(s: &Shim, f: CUfunction) -> CUresult {
    // SAFETY: forwarded unchanged under the caller's contract.
    kernel(
        s,
        f,
        [1, 1, 1],
        [0, 0, 0],
        std::ptr::null_mut(),
        false,
        || unsafe { s.cuda.cuLaunch(f) },
    )
}

/// Hook of legacy `cuLaunchGrid`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchGrid(s: &Shim, f: CUfunction, w: c_int, h: c_int) -> CUresult {
    let grid = [w.max(0) as c_uint, h.max(0) as c_uint, 1];
    // SAFETY: forwarded unchanged under the caller's contract.
    kernel(s, f, grid, [0, 0, 0], std::ptr::null_mut(), false, || unsafe {
        s.cuda.cuLaunchGrid(f, w, h)
    })
}

/// Hook of legacy `cuLaunchGridAsync`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchGridAsync(s: &Shim, f: CUfunction, w: c_int, h: c_int, stream: CUstream) -> CUresult {
    let grid = [w.max(0) as c_uint, h.max(0) as c_uint, 1];
    kernel(s, f, grid, [0, 0, 0], stream, false, || {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe { s.cuda.cuLaunchGridAsync(f, w, h, stream) }
    })
}
