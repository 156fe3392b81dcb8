//! `cuInit`, contexts and modules: the hooks. What a context or module costs and how it is measured is memory
//! policy (`memory::overhead`, `memory::host_pid`); these hooks make the driver call and report what happened.
//! Growth is admitted against the cap: a context or module that alone would exceed it is undone and the call
//! returns `CUDA_ERROR_OUT_OF_MEMORY`.

#![allow(non_snake_case)]

use crate::devices::MAX_ORDINALS;
use crate::ffi::cuda::*;
use crate::state::Shim;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `cuInit`: after the real one succeeds, learn every device (UUID → usage entry, limits).
pub fn init(s: &Shim, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r.ok() {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        if unsafe { s.cuda.cuDeviceGetCount(&mut n) }.ok() {
            for o in 0..n.min(MAX_ORDINALS as c_int) {
                let _ = s.devices.device(&s.cuda, o);
            }
        }
    }
    r
}

/// `cuCtxCreate` (bare, `_v2`, `_v3`, `_v4`): a new context on `dev`.
///
/// # Safety
/// `pctx` as the driver's contract says (written on success).
pub unsafe fn ctx_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    let r = s.mem.creating_context(&s.nvml, dev, call);
    if !r.ok() || pctx.is_null() {
        return r;
    }
    // SAFETY: written by the driver on success.
    let ctx = unsafe { *pctx };
    if s.mem
        .context_created(&s.cuda, &s.nvml, ctx as usize, dev)
        .is_err()
    {
        // SAFETY: destroying the context we just created.
        unsafe { ctx_destroy(s, || s.cuda.cuCtxDestroy_v2(ctx), ctx) };
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// `cuCtxDestroy` (bare, `_v2`).
///
/// # Safety
/// Driver contract.
pub unsafe fn ctx_destroy(s: &Shim, call: impl FnOnce() -> CUresult, ctx: CUcontext) -> CUresult {
    let owner = s.mem.context_destroying(ctx as usize);
    let r = call();
    s.mem
        .context_destroyed(&s.cuda, &s.nvml, ctx as usize, owner, r.ok());
    r
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(s: &Shim, call: impl FnOnce() -> CUresult, dev: CUdevice) -> CUresult {
    let r = s.mem.creating_context(&s.nvml, dev, call);
    if r.ok() && s.mem.primary_retained(&s.cuda, &s.nvml, dev).is_err() {
        // SAFETY: undoing our own retain.
        primary_release(s, || unsafe { s.cuda.cuDevicePrimaryCtxRelease_v2(dev) }, dev);
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// `cuDevicePrimaryCtxRelease` (bare, `_v2`).
pub fn primary_release(s: &Shim, call: impl FnOnce() -> CUresult, dev: CUdevice) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.primary_released(&s.cuda, &s.nvml, dev, false);
    }
    r
}

/// `cuDevicePrimaryCtxReset` (bare, `_v2`): our count of the primary context drops to zero.
pub fn primary_reset(s: &Shim, call: impl FnOnce() -> CUresult, dev: CUdevice) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.primary_released(&s.cuda, &s.nvml, dev, true);
    }
    r
}

/// `cuModuleLoad`, `cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`.
///
/// # Safety
/// `module` as the driver's contract says (written on success).
pub unsafe fn module_load(s: &Shim, call: impl FnOnce() -> CUresult, module: *mut CUmodule) -> CUresult {
    let r = call();
    if !r.ok() || module.is_null() {
        return r;
    }
    // SAFETY: written by the driver on success.
    let m = unsafe { *module };
    if s.mem.module_loaded(&s.cuda, &s.nvml, m as usize).is_err() {
        // SAFETY: unloading the module we just loaded.
        module_unload(s, || unsafe { s.cuda.cuModuleUnload(m) }, m);
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// `cuModuleUnload`.
pub fn module_unload(s: &Shim, call: impl FnOnce() -> CUresult, hmod: CUmodule) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.module_unloaded(&s.cuda, &s.nvml, hmod as usize);
    }
    r
}

/// `cuLibraryLoadData`, `cuLibraryLoadFromFile`.
///
/// # Safety
/// `library` as the driver's contract says (written on success).
pub unsafe fn library_load(s: &Shim, call: impl FnOnce() -> CUresult, library: *mut CUlibrary) -> CUresult {
    let r = call();
    if !r.ok() || library.is_null() {
        return r;
    }
    if s.mem.library_loaded(&s.nvml).is_err() {
        // SAFETY: written by the driver on success; unloading what we just loaded.
        let l = unsafe { *library };
        // SAFETY: as above.
        library_unload(s, || unsafe { s.cuda.cuLibraryUnload(l) });
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// `cuLibraryUnload`.
pub fn library_unload(s: &Shim, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.library_unloaded(&s.nvml);
    }
    r
}

// ---- the exports' entry points (one line each) ---------------------------------------------------------------

/// Hook of `cuInit`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuInit(s: &Shim, Flags: c_uint) -> CUresult {
    // SAFETY: forwarded unchanged.
    init(s, || unsafe { s.cuda.cuInit(Flags) })
}

/// Hook of `cuCtxCreate` (bare, same ABI as `_v2`).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate(s: &Shim, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { ctx_create(s, || s.cuda.cuCtxCreate(pctx, flags, dev), pctx, dev) }
}

/// Hook of `cuCtxCreate_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate_v2(s: &Shim, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { ctx_create(s, || s.cuda.cuCtxCreate_v2(pctx, flags, dev), pctx, dev) }
}

/// Hook of `cuCtxCreate_v3`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate_v3(
    s: &Shim,
    pctx: *mut CUcontext,
    paramsArray: *mut CUexecAffinityParam,
    numParams: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        ctx_create(
            s,
            || s.cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev),
            pctx,
            dev,
        )
    }
}

/// Hook of `cuCtxCreate_v4`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate_v4(
    s: &Shim,
    pctx: *mut CUcontext,
    ctxCreateParams: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        ctx_create(
            s,
            || s.cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev),
            pctx,
            dev,
        )
    }
}

/// Hook of `cuCtxDestroy`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxDestroy(s: &Shim, ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { ctx_destroy(s, || s.cuda.cuCtxDestroy(ctx), ctx) }
}

/// Hook of `cuCtxDestroy_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxDestroy_v2(s: &Shim, ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { ctx_destroy(s, || s.cuda.cuCtxDestroy_v2(ctx), ctx) }
}

/// Hook of `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRetain(s: &Shim, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    primary_retain(s, || unsafe { s.cuda.cuDevicePrimaryCtxRetain(pctx, dev) }, dev)
}

/// Hook of `cuDevicePrimaryCtxRelease`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRelease(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    primary_release(s, || unsafe { s.cuda.cuDevicePrimaryCtxRelease(dev) }, dev)
}

/// Hook of `cuDevicePrimaryCtxRelease_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRelease_v2(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    primary_release(s, || unsafe { s.cuda.cuDevicePrimaryCtxRelease_v2(dev) }, dev)
}

/// Hook of `cuDevicePrimaryCtxReset`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxReset(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    primary_reset(s, || unsafe { s.cuda.cuDevicePrimaryCtxReset(dev) }, dev)
}

/// Hook of `cuDevicePrimaryCtxReset_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxReset_v2(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    primary_reset(s, || unsafe { s.cuda.cuDevicePrimaryCtxReset_v2(dev) }, dev)
}

/// Hook of `cuModuleLoad`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoad(s: &Shim, module: *mut CUmodule, fname: *const c_char) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { module_load(s, || s.cuda.cuModuleLoad(module, fname), module) }
}

/// Hook of `cuModuleLoadData`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoadData(s: &Shim, module: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { module_load(s, || s.cuda.cuModuleLoadData(module, image), module) }
}

/// Hook of `cuModuleLoadDataEx`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoadDataEx(
    s: &Shim,
    module: *mut CUmodule,
    image: *const c_void,
    numOptions: c_uint,
    options: *mut CUjit_option,
    optionValues: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        module_load(
            s,
            || {
                s.cuda
                    .cuModuleLoadDataEx(module, image, numOptions, options, optionValues)
            },
            module,
        )
    }
}

/// Hook of `cuModuleLoadFatBinary`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoadFatBinary(s: &Shim, module: *mut CUmodule, fatCubin: *const c_void) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { module_load(s, || s.cuda.cuModuleLoadFatBinary(module, fatCubin), module) }
}

/// Hook of `cuModuleUnload`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleUnload(s: &Shim, hmod: CUmodule) -> CUresult {
    // SAFETY: forwarded unchanged.
    module_unload(s, || unsafe { s.cuda.cuModuleUnload(hmod) }, hmod)
}

/// Hook of `cuLibraryLoadData`.
///
/// # Safety
/// Driver contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLibraryLoadData(
    s: &Shim,
    library: *mut CUlibrary,
    code: *const c_void,
    jitOptions: *mut CUjit_option,
    jitOptionsValues: *mut *mut c_void,
    numJitOptions: c_uint,
    libraryOptions: *mut CUlibraryOption,
    libraryOptionValues: *mut *mut c_void,
    numLibraryOptions: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        library_load(
            s,
            || {
                s.cuda.cuLibraryLoadData(
                    library,
                    code,
                    jitOptions,
                    jitOptionsValues,
                    numJitOptions,
                    libraryOptions,
                    libraryOptionValues,
                    numLibraryOptions,
                )
            },
            library,
        )
    }
}

/// Hook of `cuLibraryLoadFromFile`.
///
/// # Safety
/// Driver contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLibraryLoadFromFile(
    s: &Shim,
    library: *mut CUlibrary,
    fileName: *const c_char,
    jitOptions: *mut CUjit_option,
    jitOptionsValues: *mut *mut c_void,
    numJitOptions: c_uint,
    libraryOptions: *mut CUlibraryOption,
    libraryOptionValues: *mut *mut c_void,
    numLibraryOptions: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe {
        library_load(
            s,
            || {
                s.cuda.cuLibraryLoadFromFile(
                    library,
                    fileName,
                    jitOptions,
                    jitOptionsValues,
                    numJitOptions,
                    libraryOptions,
                    libraryOptionValues,
                    numLibraryOptions,
                )
            },
            library,
        )
    }
}

/// Hook of `cuLibraryUnload`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLibraryUnload(s: &Shim, library: CUlibrary) -> CUresult {
    // SAFETY: forwarded unchanged.
    library_unload(s, || unsafe { s.cuda.cuLibraryUnload(library) })
}
