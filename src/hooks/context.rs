//! `cuInit`, contexts, context limits and lookups: the hooks. What a context costs and how it is measured is
//! memory policy (`memory::overhead`, `memory::host_pid`), as is what a lookup loads (`memory::first_use`);
//! these hooks decode the arguments, make the driver call through memory's guards and undo what memory refused.
//! A context first reserves an estimate of its cost (`OverheadCall::Create`: refused up front when that does
//! not fit, so the driver is not called); after the call the cost is measured and the charge settled to it. A
//! context that does not fit is destroyed (by [`ctx_destroy`], the `undo` these hooks give memory) and the call
//! returns `CUDA_ERROR_OUT_OF_MEMORY`. Module and library loads: `hooks::module`.

use super::Width;
use crate::devices::MAX_ORDINALS;
use crate::ffi::cuda::*;
use crate::memory::{Creation, OverheadCall};
use crate::state::Shim;
use std::ffi::c_int;

/// `cuInit`: after the real one succeeds, learn every device (UUID → usage entry, limits).
pub(crate) fn init(s: &Shim, call: impl FnOnce() -> CUresult) -> CUresult {
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
pub(crate) unsafe fn ctx_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: written by the driver on success (read only then, and only when not NULL).
    let out = || (!pctx.is_null()).then(|| unsafe { *pctx } as usize);
    let undo = |ctx: usize| {
        let ctx = ctx as CUcontext;
        // SAFETY: destroying the context the driver just created for this call.
        unsafe { ctx_destroy(s, || s.cuda.cuCtxDestroy_v2(ctx), ctx) };
    };
    let create = OverheadCall::Create {
        what: Creation::Context(dev),
        out: &out,
        undo: &undo,
    };
    s.mem.overhead().call(&s.cuda, &s.nvml, create, call)
}

/// `cuCtxDestroy` (bare, `_v2`).
///
/// # Safety
/// Driver contract.
pub(crate) unsafe fn ctx_destroy(s: &Shim, call: impl FnOnce() -> CUresult, ctx: CUcontext) -> CUresult {
    let destroy = OverheadCall::Destroy(ctx as usize);
    let r = s.mem.overhead().call(&s.cuda, &s.nvml, destroy, || {
        // A probe measuring a launch in this context is charged up to the context's end, never dropped.
        let probes = s.throttle.context_ending(&s.nvml, Some(ctx as usize), 0, true);
        let r = call();
        s.throttle.context_ended(&probes);
        r
    });
    s.throttle.contexts_changed();
    r
}

/// `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// `pctx` as the driver's contract says (written on success).
pub(crate) unsafe fn primary_retain(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    // Only the first retain creates the context; later ones cost nothing.
    let retain = || {
        let r = call();
        if r.ok() && !pctx.is_null() {
            // SAFETY: written by the driver on success.
            s.throttle.primary_is(dev, unsafe { *pctx } as usize);
        }
        r
    };
    let undo = |_| {
        // SAFETY: undoing our own retain.
        primary_release(
            s,
            || unsafe { s.cuda.cuDevicePrimaryCtxRelease_v2(dev) },
            dev,
            false,
        );
    };
    let create = OverheadCall::Create {
        what: Creation::Primary(dev),
        out: &|| None,
        undo: &undo,
    };
    s.mem.overhead().call(&s.cuda, &s.nvml, create, retain)
}

/// `cuDevicePrimaryCtxRelease` and, with `reset` (our count drops to zero), `cuDevicePrimaryCtxReset` (each
/// bare and `_v2`).
pub(crate) fn primary_release(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dev: CUdevice,
    reset: bool,
) -> CUresult {
    // A reset ends the context: its probes are polled a last time, then charged up to its end.
    let probes = if reset {
        s.throttle.context_ending(&s.nvml, None, dev, true)
    } else {
        Vec::new()
    };
    // Our last hold: the context may be gone (its events are not touched again).
    let last = || {
        let gone = s.throttle.context_ending(&s.nvml, None, dev, false);
        s.throttle.context_ended(&gone);
    };
    let release = OverheadCall::PrimaryRelease {
        ordinal: dev,
        reset,
        last: &last,
    };
    let r = s.mem.overhead().call(&s.cuda, &s.nvml, release, || {
        let r = call();
        s.throttle.context_ended(&probes);
        r
    });
    if r.ok() {
        s.throttle.contexts_changed();
    }
    r
}

/// `cuCtxSetLimit`: raising a limit that reserves device memory is admitted against the cap
/// ([`OverheadCall::SetLimit`]).
pub(crate) fn set_limit(s: &Shim, call: impl FnOnce() -> CUresult, limit: CUlimit, value: usize) -> CUresult {
    let set = OverheadCall::SetLimit { limit, value };
    s.mem.overhead().call(&s.cuda, &s.nvml, set, call)
}

pub(crate) use crate::memory::Owner;

/// `cuModuleGetFunction`, `cuModuleGetGlobal` (+ `_v2`), `cuLibraryGetGlobal`, `cuLibraryGetManaged`,
/// `cuLibraryGetModule`, `cuKernelGetFunction`: the driver may load code and globals here (lazy loading),
/// admitted under a memory cap (`FirstUse::lookup`). `out` is the handle the call returns.
///
/// # Safety
/// `out` as the driver's contract says (written on success).
pub(crate) unsafe fn first_use<W: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    out: *mut W,
    owner: Owner,
) -> CUresult {
    // SAFETY: written by the driver on success (read only then, and only when not NULL).
    let handle = || (!out.is_null()).then(|| unsafe { *out }.to_u64() as usize);
    s.mem.first_use().lookup(&s.cuda, &s.nvml, owner, call, handle)
}

/// `cuLibraryGetModule`: a lookup ([`first_use`]) whose module lives in the current context: its device and
/// image are recorded, so that lookups in it from another device are admitted there.
///
/// # Safety
/// `module` as the driver's contract says (written on success).
pub(crate) unsafe fn library_get_module(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    module: *mut CUmodule,
    library: CUlibrary,
) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { first_use(s, call, module.cast::<usize>(), Owner::ModuleOf(library)) }
}

/// `cuFuncLoad`: forces `function`'s code to load (lazy loading), admitted as a lookup of it
/// ([`Owner::Function`]).
pub(crate) fn function_load(s: &Shim, call: impl FnOnce() -> CUresult, function: CUfunction) -> CUresult {
    let handle = || Some(function as usize);
    s.mem
        .first_use()
        .lookup(&s.cuda, &s.nvml, Owner::Function(function), call, handle)
}
