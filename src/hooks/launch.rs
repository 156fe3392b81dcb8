//! Every path that puts work on the GPU, so the export surface is complete. For now each hook forwards to the
//! real driver unchanged; the throttle (src/throttle) takes these over to charge GPU time per launch.
//!
//! Paths: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel (each also `_ptsz`),
//! cuLaunchCooperativeKernelMultiDevice, cuGraphLaunch (+ `_ptsz`), legacy cuLaunch / cuLaunchGrid /
//! cuLaunchGridAsync.

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::ffi::cuda::*;
use crate::state::Shim;
use std::ffi::{c_int, c_uint, c_void};

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
    // SAFETY: forwarded unchanged.
    unsafe {
        s.cuda
            .cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
    }
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
    // SAFETY: forwarded unchanged.
    unsafe {
        s.cuda
            .cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
    }
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
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuLaunchKernelEx(config, f, params, extra) }
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
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuLaunchKernelEx_ptsz(config, f, params, extra) }
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
    // SAFETY: forwarded unchanged.
    unsafe {
        s.cuda
            .cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)
    }
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
    // SAFETY: forwarded unchanged.
    unsafe {
        s.cuda
            .cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params)
    }
}

/// Hook of `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchCooperativeKernelMultiDevice(
    s: &Shim,
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        s.cuda
            .cuLaunchCooperativeKernelMultiDevice(list, num_devices, flags)
    }
}

/// Hook of `cuGraphLaunch`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGraphLaunch(s: &Shim, exec: CUgraphExec, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuGraphLaunch(exec, stream) }
}

/// Hook of `cuGraphLaunch_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGraphLaunch_ptsz(s: &Shim, exec: CUgraphExec, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuGraphLaunch_ptsz(exec, stream) }
}

/// Hook of legacy `cuLaunch`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunch(s: &Shim, f: CUfunction) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuLaunch(f) }
}

/// Hook of legacy `cuLaunchGrid`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchGrid(s: &Shim, f: CUfunction, w: c_int, h: c_int) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuLaunchGrid(f, w, h) }
}

/// Hook of legacy `cuLaunchGridAsync`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLaunchGridAsync(s: &Shim, f: CUfunction, w: c_int, h: c_int, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { s.cuda.cuLaunchGridAsync(f, w, h, stream) }
}
