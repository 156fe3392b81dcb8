//! `cuInit`, contexts and modules: the hooks. What a context or module costs and how it is measured is memory
//! policy (`memory::overhead`, `memory::host_pid`); these hooks make the driver call and report what happened.
//! A context or module first reserves an estimate of its cost (refused up front when that does not fit, so the
//! driver is not called); after the call the cost is measured and the charge settled to it. Growth beyond the
//! estimate is admitted against the cap: a context or module that does not fit is undone and the call returns
//! `CUDA_ERROR_OUT_OF_MEMORY`.

use super::image_copy::{self, ImageCopy};
use super::Width;
use crate::devices::{Dev, MAX_ORDINALS};
use crate::driver::cuda::in_context;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::overhead::Image;
use crate::memory::overhead::{Creation, Reservation};
use crate::memory::reconcile::{FirstUseCall, FirstUseOf, Use};
use crate::memory::OverCap;
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
    let Ok(res) = reserve(s, dev, Creation::Context) else {
        return CUresult::ERROR_OUT_OF_MEMORY;
    };
    let r = s.mem.creating_context(&s.nvml, dev, call);
    let created = r.ok() && !pctx.is_null();
    returned(s, &res, created);
    if !created {
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
    measured(s, res);
    r
}

/// Reserves the estimate for creating `what` on ordinal `dev` (`Ok(None)`: a device without accounting).
fn reserve(s: &Shim, dev: CUdevice, what: Creation) -> Result<Option<Reservation>, ()> {
    match s.devices.device(&s.cuda, dev) {
        Some(d) => s.mem.reserve_creation(d, what).map(Some).map_err(|_| ()),
        None => Ok(None),
    }
}

fn returned(s: &Shim, res: &Option<Reservation>, ok: bool) {
    if let Some(res) = res {
        s.mem.creation_returned(&s.nvml, res, ok);
    }
}

fn measured(s: &Shim, res: Option<Reservation>) {
    if let Some(res) = res {
        s.mem.creation_measured(res);
    }
}

/// `cuCtxDestroy` (bare, `_v2`).
///
/// # Safety
/// Driver contract.
pub(crate) unsafe fn ctx_destroy(s: &Shim, call: impl FnOnce() -> CUresult, ctx: CUcontext) -> CUresult {
    let owner = s.mem.context_destroying(ctx as usize);
    // A probe measuring a launch in this context is charged up to the context's end, never dropped.
    let probes = s.throttle.context_ending(&s.nvml, Some(ctx as usize), 0, true);
    let r = call();
    s.throttle.context_ended(&probes);
    s.mem
        .context_destroyed(&s.cuda, &s.nvml, ctx as usize, owner, r.ok());
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
    let res = if s.mem.primary_unheld(dev) {
        let Ok(res) = reserve(s, dev, Creation::Context) else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        res
    } else {
        None
    };
    let r = s.mem.creating_context(&s.nvml, dev, call);
    returned(s, &res, r.ok());
    if !r.ok() {
        return r;
    }
    if !pctx.is_null() {
        // SAFETY: written by the driver on success.
        s.throttle.primary_is(dev, unsafe { *pctx } as usize);
    }
    if s.mem.primary_retained(&s.cuda, &s.nvml, dev).is_err() {
        // SAFETY: undoing our own retain.
        primary_release(
            s,
            || unsafe { s.cuda.cuDevicePrimaryCtxRelease_v2(dev) },
            dev,
            false,
        );
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    measured(s, res);
    r
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
    let r = call();
    s.throttle.context_ended(&probes);
    if r.ok() {
        s.mem.primary_released(&s.cuda, &s.nvml, dev, reset);
        if !reset && s.mem.primary_unheld(dev) {
            // Our last hold: the context may be gone (its events are not touched again).
            let gone = s.throttle.context_ending(&s.nvml, None, dev, false);
            s.throttle.context_ended(&gone);
        }
        s.throttle.contexts_changed();
    }
    r
}

/// `cuCtxSetLimit`: the stack size (per thread, for every thread the device can hold), the printf FIFO, the
/// malloc heap and the device runtime's pending-launch buffer (and its sync depth on older GPUs) reserve device
/// memory in the current context. Raising one is admitted against the cap first (`CUDA_ERROR_OUT_OF_MEMORY`
/// over it, the driver not asked) by an estimate where the size is known (stack, FIFO, heap; the others' cost
/// per unit is the driver's own, so nothing), then the overhead is re-measured: a raised limit whose
/// reservation does not fit is set back and refused. Any limit this list does not know is treated so too.
pub(crate) fn set_limit(s: &Shim, call: impl FnOnce() -> CUresult, limit: CUlimit, value: usize) -> CUresult {
    // Cache hints and query-only values: no device memory.
    if matches!(
        limit,
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY
            | CU_LIMIT_PERSISTING_L2_CACHE_SIZE
            | CU_LIMIT_SHMEM_SIZE
            | CU_LIMIT_CIG_ENABLED
            | CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED
    ) {
        return call();
    }
    let Some(dev) = s.devices.current(&s.cuda) else {
        return call();
    };
    let bytes = |v: usize| -> u64 {
        match limit {
            CU_LIMIT_PRINTF_FIFO_SIZE | CU_LIMIT_MALLOC_HEAP_SIZE => v as u64,
            CU_LIMIT_STACK_SIZE => super::stack::bytes(s, dev, v as u64),
            _ => 0,
        }
    };
    let mut cur: usize = 0;
    // SAFETY: valid out-pointer; a failed query leaves 0 (the whole new reservation is admitted).
    let known = unsafe { s.cuda.cuCtxGetLimit(&mut cur, limit) }.ok();
    let growth = bytes(value).saturating_sub(bytes(cur));
    // SAFETY: setting the limit back to the value it had.
    let undo = (known && value > cur).then_some(|| unsafe { s.cuda.cuCtxSetLimit(limit, cur) });
    s.mem.setting_limit(&s.nvml, dev, growth, call, undo)
}

/// Whose code or globals a lookup may load.
#[derive(Clone, Copy)]
pub(crate) enum Owner {
    /// A module's (its context's device).
    Module(CUmodule),
    /// A library's (loaded into the current context at its first use there).
    Library(CUlibrary),
    /// A kernel's (its library's, loaded into the current context; `cuKernelGetLibrary`, CUDA 12.5+, else
    /// unknown).
    Kernel(CUkernel),
}

/// `cuModuleGetFunction`, `cuModuleGetGlobal` (+ `_v2`), `cuLibraryGetGlobal`, `cuLibraryGetManaged`,
/// `cuLibraryGetModule`, `cuKernelGetFunction`: with lazy loading (CUDA's default) the driver loads the code and
/// globals here, at first use, not at the module's load: into `module`'s context (a library's lookups: the
/// current one). While a memory cap applies, admitted before the call (`memory::reconcile`): the whole footprint
/// of the owner's image is reserved (refused when it does not fit, or while the container is over its cap);
/// the first time a handle comes back, this process is measured there. A module whose device this process does
/// not know (`cuFuncGetModule`'s of a kernel's function) may live on any device: refused while any capped
/// device is over its cap (fail closed), every capped device measured after.
///
/// # Safety
/// `out` as the driver's contract says (written on success).
pub(crate) unsafe fn first_use<W: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    out: *mut W,
    owner: Owner,
) -> CUresult {
    let (devs, image, ctx): (Vec<Dev>, _, _) = match owner {
        Owner::Module(m) => match s.mem.module_device(&s.cuda, m as usize) {
            Some(d) => (vec![d], s.mem.image_of(m as usize), 0),
            None => (s.devices.known().map(|(d, _)| d).collect(), None, 0),
        },
        Owner::Library(l) => (
            s.devices.current(&s.cuda).into_iter().collect(),
            s.mem.image_of(l as usize),
            current_ctx(s),
        ),
        Owner::Kernel(k) => {
            let mut l: CUlibrary = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the program's kernel handle, which the driver checks.
            let image = unsafe { s.cuda.cuKernelGetLibrary(&mut l, k) }
                .ok()
                .then(|| s.mem.image_of(l as usize))
                .flatten();
            (
                s.devices.current(&s.cuda).into_iter().collect(),
                image,
                current_ctx(s),
            )
        }
    };
    let what = FirstUseOf {
        stack: 0,
        image,
        ctx,
        lookup: true,
    };
    let mut calls = Vec::with_capacity(devs.len());
    for d in devs {
        match s.mem.first_use_begin(&s.cuda, d, what) {
            Ok(Some(c)) => calls.push(c),
            Ok(None) => {}
            Err(_) => {
                for c in calls {
                    s.mem
                        .first_use_done(&s.cuda, &s.nvml, c, CUresult::ERROR_OUT_OF_MEMORY, false);
                }
                return CUresult::ERROR_OUT_OF_MEMORY;
            }
        }
    }
    if calls.is_empty() {
        return call();
    }
    let since = s.mem.first_use_generation();
    let r = call();
    // Without an out-pointer (optional for globals) the lookup cannot be told from the last one: measured
    // every time (such calls are rare; a loop of them costs only its own process).
    let fresh = r.ok() && {
        // SAFETY: written by the driver on success (read only when not NULL).
        let h = (!out.is_null()).then(|| unsafe { *out }.to_u64() as usize);
        h.is_none_or(|h| s.mem.first_seen(Use::Lookup, h, current_ctx(s), since))
    };
    for c in calls {
        s.mem.first_use_done(&s.cuda, &s.nvml, c, r, fresh);
    }
    r
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
    let r = unsafe { first_use(s, call, module.cast::<usize>(), Owner::Library(library)) };
    if let (true, Some(dev)) = (r.ok() && !module.is_null(), s.devices.current(&s.cuda)) {
        // SAFETY: written by the driver on success.
        s.mem
            .module_on(unsafe { *module } as usize, dev, library as usize);
    }
    r
}

/// `cuFuncLoad`: forces `function`'s code to load (lazy loading) in its module's context. Measured the first
/// time in a context, as a lookup that returned it.
pub(crate) fn function_load(s: &Shim, call: impl FnOnce() -> CUresult, function: CUfunction) -> CUresult {
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: valid out-pointer; on failure it stays NULL, a module no one loaded (every device checked).
    let _ = unsafe { s.cuda.cuFuncGetModule(&mut module, function) };
    let mut f = function as usize;
    // SAFETY: `f` is a local the hook only reads.
    unsafe { first_use(s, call, &mut f, Owner::Module(module)) }
}

/// The context current on this thread (0 when none): a function's first launch is per context.
#[inline]
fn current_ctx(s: &Shim) -> usize {
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; on failure it stays NULL.
    let _ = unsafe { s.cuda.cuCtxGetCurrent(&mut c) };
    c as usize
}

/// The context a launch on `stream` (a handle, or `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD` for the NULL
/// stream) runs in, where the driver loads its code and grows its stack: the stream's own, whatever is current.
#[inline]
fn launch_ctx(s: &Shim, stream: usize) -> usize {
    if stream > CU_STREAM_PER_THREAD {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the program's stream for this launch, which the driver checks.
        if unsafe { s.cuda.cuStreamGetCtx(stream as CUstream, &mut c) }.ok() && !c.is_null() {
            return c as usize;
        }
    }
    current_ctx(s)
}

/// What [`first_launch`] let through; end it with [`launched`].
pub(crate) enum Launch<'a> {
    /// Launched in its context before, as of this generation of the seen set (a forget since, e.g. a context
    /// reset while the throttle held the launch back, makes it a first use again).
    Seen(u64),
    /// Its first launch in its context (boxed: the launch path carries two words, not the whole record).
    First(Box<FirstLaunch<'a>>),
}

/// A first launch [`first_launch`] let through.
pub(crate) struct FirstLaunch<'a> {
    call: Option<FirstUseCall<'a>>,
    how: Use,
    f: usize,
    ctx: usize,
    /// The seen set's generation before the launch: a module unloaded since may have freed `f`'s address.
    since: u64,
    /// Made while its stream was capturing: nothing loads or grows until the graph is launched, so the function
    /// is not marked launched.
    capturing: bool,
}

/// Before a launch of `f` (a function or kernel handle) on `stream` while a memory cap may apply: `Ok(None)`
/// when `f` was launched in the stream's context already (one shard lock). Otherwise, its first launch there:
/// the code may load now (lazy loading) and a kernel whose local memory exceeds the context's stack size makes
/// the driver grow the stack for every thread the device holds. That growth is admitted here, asked of the
/// stream's context and device (`Err`: refuse the launch with `CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked,
/// `f` not marked); [`first_launch_done`] measures the process after the launch and marks `f` launched in that
/// context if it succeeded.
/// `how` is [`Use::Launch`] (`f` a function or kernel) or [`Use::Graph`] (`f` a graph exec, launched or uploaded:
/// the stack its kernels need and their code's loading, listed at instantiation and update, are admitted the
/// same way).
#[inline(always)]
pub(crate) fn first_launch(s: &Shim, how: Use, f: usize, stream: usize) -> Result<Launch<'_>, OverCap> {
    let ctx = launch_ctx(s, stream);
    if let Some(since) = s.mem.seen(how, f, ctx) {
        return Ok(Launch::Seen(since));
    }
    first_launch_slow(s, how, f, ctx, stream)
}

/// [`first_launch`] into `slot` (the launch path's form: a launch seen before stores its answer and goes on,
/// with no refusal to check). False: refused.
#[inline(always)]
pub(crate) fn first_launch_to<'a>(
    s: &'a Shim,
    how: Use,
    f: usize,
    stream: usize,
    slot: &mut Option<Launch<'a>>,
) -> bool {
    let ctx = launch_ctx(s, stream);
    if let Some(since) = s.mem.seen(how, f, ctx) {
        *slot = Some(Launch::Seen(since));
        return true;
    }
    first_launch_slow_to(s, how, f, ctx, stream, slot)
}

#[cold]
#[inline(never)]
fn first_launch_slow_to<'a>(
    s: &'a Shim,
    how: Use,
    f: usize,
    ctx: usize,
    stream: usize,
    slot: &mut Option<Launch<'a>>,
) -> bool {
    match first_launch_slow(s, how, f, ctx, stream) {
        Ok(l) => {
            *slot = Some(l);
            true
        }
        Err(_) => false,
    }
}

/// Whether `a` and `b` are both first launches on one device (with a cap).
pub(crate) fn same_device(a: &Launch<'_>, b: &Launch<'_>) -> bool {
    let dev = |l: &Launch<'_>| match l {
        Launch::First(c) => c.call.as_ref().map(|c| c.dev()),
        _ => None,
    };
    dev(a).is_some_and(|d| dev(b) == Some(d))
}

/// The launch on `stream` that [`first_launch`] let through returned `r`.
#[inline]
pub(crate) fn launched(s: &Shim, l: Launch<'_>, stream: usize, r: CUresult) {
    match l {
        Launch::Seen(since) if s.mem.first_use_generation() != since => forgotten_meanwhile(s, stream, r),
        Launch::Seen(_) => {}
        Launch::First(c) => first_launch_done(s, *c, r),
    }
}

/// A launch seen before, during which the seen set forgot something: its code and stack may have been taken
/// again (a reset context set up anew), unadmitted. Measured after, as a first use whose size is unknown.
#[cold]
#[inline(never)]
fn forgotten_meanwhile(s: &Shim, stream: usize, r: CUresult) {
    let ctx = launch_ctx(s, stream) as CUcontext;
    let current = || s.devices.current(&s.cuda);
    let dev = in_context(&s.cuda, ctx, current).unwrap_or_else(current);
    if let Some(c) = dev.and_then(|d| s.mem.first_use_watch(d)) {
        s.mem.first_use_done(&s.cuda, &s.nvml, c, r, true);
    }
}

#[cold]
#[inline(never)]
fn first_launch_slow(s: &Shim, how: Use, f: usize, ctx: usize, stream: usize) -> Result<Launch<'_>, OverCap> {
    let since = s.mem.first_use_generation();
    let mut status: CUstreamCaptureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the program's stream for this launch. Unknown: not capturing (measured, marked).
    let capturing = unsafe { s.cuda.cuStreamIsCapturing(stream as CUstream, &mut status) }.ok()
        && status != CU_STREAM_CAPTURE_STATUS_NONE;
    // Device, stack size and kernel attributes are the stream's context's. One that cannot be made current
    // (destroyed: the launch fails too) is asked in the current context.
    let call = if ctx == current_ctx(s) {
        first_launch_begin(s, how, f, ctx)
    } else {
        in_context(&s.cuda, ctx as CUcontext, || first_launch_begin(s, how, f, ctx))
            .unwrap_or_else(|| first_launch_begin(s, how, f, ctx))
    }?;
    Ok(Launch::First(Box::new(FirstLaunch {
        call,
        how,
        f,
        ctx,
        since,
        capturing,
    })))
}

/// The admission of `f`'s first launch in context `ctx`, which must be current: [`Use::Launch`] reserves `f`'s
/// stack growth and loads its code first ([`loaded`]); [`Use::Graph`] (`f` an exec) reserves the stack its
/// kernels grow and loads the code of each of its kernels not launched in `ctx` yet: the launch itself takes no
/// code. End it with `Memory::first_use_done` once the launch returned. Never holds a lock across the launch.
pub(crate) fn first_launch_begin(
    s: &Shim,
    how: Use,
    f: usize,
    ctx: usize,
) -> Result<Option<FirstUseCall<'_>>, OverCap> {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return Ok(None);
    };
    if s.mem.limit(dev).is_none() {
        return Ok(None);
    }
    // Never the gate: a launch may wait on the program (a full stream), and nothing else may wait behind it.
    // Its code is loaded before the launch (below): the launch itself may only grow the stack.
    let mut what = FirstUseOf {
        ctx,
        image: Some(Image {
            key: 0,
            bytes: Some(0),
        }),
        ..FirstUseOf::default()
    };
    if how == Use::Graph {
        what.stack = super::stack::graph_growth(s, dev, f);
        let call = s.mem.first_use_begin(&s.cuda, dev, what)?;
        // Each kernel not launched here yet, as its direct first launch would (instantiation refuses an exec
        // whose kernels cannot all be listed while a cap applies).
        let kernels = s.mem.graph().kernels(f);
        let first = kernels
            .into_iter()
            .filter(|&k| s.mem.seen(Use::Launch, k, ctx).is_none());
        return loaded_first(s, call, first);
    }
    let f = f as CUfunction;
    let Some(local) = super::stack::local_size(s, f, dev.ordinal) else {
        log!(
            Level::Error,
            "launch of function {f:p} refused: the driver will not give its local memory size, so the stack its \
             first launch grows cannot be admitted under the memory cap"
        );
        return Err(OverCap);
    };
    if local > 0 {
        what.stack = super::stack::bytes(s, dev, local.saturating_sub(super::stack::size(s)));
    }
    // The stack first: a launch refused for it loads nothing.
    let call = s.mem.first_use_begin(&s.cuda, dev, what)?;
    loaded_first(s, call, [f as usize])
}

/// `call` (a first launch's admission) once each of `funcs` has its code loaded ([`loaded`]); one refused
/// refuses the launch (`call` ended).
fn loaded_first<'a>(
    s: &'a Shim,
    call: Option<FirstUseCall<'a>>,
    funcs: impl IntoIterator<Item = usize>,
) -> Result<Option<FirstUseCall<'a>>, OverCap> {
    for f in funcs {
        if !loaded(s, f as CUfunction) {
            if let Some(c) = call {
                s.mem
                    .first_use_done(&s.cuda, &s.nvml, c, CUresult::ERROR_OUT_OF_MEMORY, false);
            }
            return Err(OverCap);
        }
    }
    Ok(call)
}

/// Before a first launch of `f` in the current context: its code is loaded first, as the program's own call
/// would load it (a lookup: admitted from its image, measured; it never waits on the program), so the launch
/// itself takes no code. A function (a lazily loaded one may still be unloaded): `cuFuncLoad`; a `CUkernel`
/// (static cudart 12+ launches those; its library loads into the context): `cuKernelGetFunction`. False:
/// refused (over the cap). A handle that is neither, or a driver without `cuFuncLoad`, fails in the driver.
pub(crate) fn loaded(s: &Shim, f: CUfunction) -> bool {
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `f` is the program's handle for this launch, which the driver checks.
    let r = if unsafe { s.cuda.cuFuncGetModule(&mut module, f) }.ok() {
        // SAFETY: the program's handle; the driver checks it.
        function_load(s, || unsafe { s.cuda.cuFuncLoad(f) }, f)
    } else {
        let mut g: CUfunction = std::ptr::null_mut();
        let gp: *mut CUfunction = &mut g;
        // SAFETY: `gp` is a local out-pointer; `f` is the program's handle for this launch.
        unsafe {
            first_use(
                s,
                || s.cuda.cuKernelGetFunction(gp, f as CUkernel),
                gp.cast::<usize>(),
                Owner::Kernel(f as CUkernel),
            )
        }
    };
    r != CUresult::ERROR_OUT_OF_MEMORY
}

/// The first launch [`first_launch`] let through returned `r`.
#[cold]
#[inline(never)]
fn first_launch_done(s: &Shim, c: FirstLaunch<'_>, r: CUresult) {
    if let Some(call) = c.call {
        s.mem.first_use_done(&s.cuda, &s.nvml, call, r, true);
    }
    if r.ok() && !c.capturing {
        s.mem.first_seen(c.how, c.f, c.ctx, c.since);
    }
}

/// The image a load hands the driver, read for its footprint (`memory::image`) once the driver accepted it.
#[derive(Clone, Copy)]
pub(crate) enum ImageAt {
    /// In memory (`cuModuleLoadData`, `…Ex`, `cuModuleLoadFatBinary`, `cuLibraryLoadData`).
    Memory(*const std::ffi::c_void),
    /// A file's contents, read once by us and handed to the driver as they are (`cuModuleLoad`,
    /// `cuLibraryLoadFromFile`: see [`read_image_file`]).
    Bytes(*const u8, usize),
    /// Read before the call from our own copy, which the driver was handed (`image_copy`).
    Known(Option<u64>),
}

impl ImageAt {
    /// Compressed fat-binary entries are decompressed only while a memory cap may apply (a cap set later meets
    /// them as images of unknown footprint: measured after their first use).
    ///
    /// # Safety
    /// The image is one the driver just loaded (complete in memory, or `len` readable bytes).
    unsafe fn footprint(self, s: &Shim, arch: Option<u32>) -> Option<u64> {
        s.devices.refresh_if_changed();
        let inflate = s.devices.memory_limited();
        match self {
            // SAFETY: the caller's contract.
            ImageAt::Memory(p) => unsafe { crate::memory::image::footprint_at(p.cast(), inflate, arch) },
            ImageAt::Bytes(p, n) => {
                // SAFETY: `n` readable bytes at `p` (the caller's contract).
                let data = unsafe { std::slice::from_raw_parts(p, n) };
                crate::memory::image::footprint(data, inflate, arch)
            }
            ImageAt::Known(f) => f,
        }
    }
}

/// The compute capability (`major * 10 + minor`) of the current context's device: a module's image is read
/// for the entries the driver could load there. `None` when the driver will not say (every entry counts).
/// Libraries are loaded into every context lazily: their images are read whole (`None`).
fn module_arch(s: &Shim) -> Option<u32> {
    let d = s.devices.current(&s.cuda)?;
    let attr = |a| {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: valid out-pointer.
        let ok = unsafe { s.cuda.cuDeviceGetAttribute(&mut n, a, d.ordinal) }.ok();
        (ok && (0..100).contains(&n)).then_some(n as u32)
    };
    Some(
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? * 10
            + attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    )
}

/// A module or library file's contents, read once: the driver is handed these very bytes from memory, so what
/// it loads is what the footprint was read from (reading the file again after the driver did would let a
/// program swap it in between, and would wait forever on a FIFO or a pipe written once). Followed by 8 NULs
/// (PTX text ends at a NUL). `Err`: the driver's answer for it (unreadable: not found; a binary format whose
/// headers point past the file: an invalid image, never read past our copy).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn read_image_file(path: *const std::ffi::c_char) -> Result<(Vec<u8>, usize), CUresult> {
    if path.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes());
    let mut data = std::fs::read(path).map_err(|_| CUresult::ERROR_FILE_NOT_FOUND)?;
    if !crate::memory::image::inside(&data) {
        return Err(CUresult::ERROR_INVALID_IMAGE);
    }
    let len = data.len();
    data.extend_from_slice(&[0; 8]);
    Ok((data, len))
}

/// `cuModuleLoad`: the file read once ([`read_image_file`]) and loaded with `cuModuleLoadData`.
///
/// # Safety
/// As `cuModuleLoad` requires.
pub(crate) unsafe fn module_load_file(
    s: &Shim,
    _call: impl FnOnce() -> CUresult,
    module: *mut CUmodule,
    fname: *const std::ffi::c_char,
) -> CUresult {
    // SAFETY: the caller's contract.
    let (data, len) = match unsafe { read_image_file(fname) } {
        Ok(d) => d,
        Err(r) => return r,
    };
    let p = data.as_ptr();
    // SAFETY: `data` outlives the call (the driver copies a module's image); `module` is the program's.
    unsafe {
        module_load(
            s,
            || s.cuda.cuModuleLoadData(module, p.cast()),
            module,
            ImageAt::Bytes(p, len),
        )
    }
}

/// `cuLibraryLoadFromFile`: the file read once ([`read_image_file`]) and loaded with `cuLibraryLoadData` and the
/// same options (our copy of them). `CU_LIBRARY_BINARY_IS_PRESERVED` is refused, as the driver refuses it for
/// a file, so the driver keeps its own copy and ours is freed after the call.
///
/// # Safety
/// As `cuLibraryLoadFromFile` requires.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_file(
    s: &Shim,
    _call: impl FnOnce() -> CUresult,
    library: *mut CUlibrary,
    file: *const std::ffi::c_char,
    jit_options: *mut CUjit_option,
    jit_values: *mut *mut std::ffi::c_void,
    n_jit: std::ffi::c_uint,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut *mut std::ffi::c_void,
    n_lib: std::ffi::c_uint,
) -> CUresult {
    // SAFETY: the caller's contract.
    let (data, len) = match unsafe { read_image_file(file) } {
        Ok(d) => d,
        Err(r) => return r,
    };
    // SAFETY: the caller's contract.
    let (mut o, mut v, preserved) = match unsafe { library_options(lib_options, lib_values, n_lib) } {
        Ok(x) => x,
        Err(r) => return r,
    };
    if preserved {
        return CUresult::ERROR_INVALID_VALUE; // the driver's answer for a file (cuda.h)
    }
    let p = data.as_ptr();
    // SAFETY: `data` outlives the call (not preserved: the driver keeps its own copy); the options are our copy
    // of the program's.
    unsafe {
        library_load(
            s,
            || {
                s.cuda.cuLibraryLoadData(
                    library,
                    p.cast(),
                    jit_options,
                    jit_values,
                    n_jit,
                    or_null(&mut o),
                    or_null(&mut v),
                    n_lib,
                )
            },
            library,
            ImageAt::Bytes(p, len),
        )
    }
}

/// `CUlibraryOption`: the driver may read `code` until `cuLibraryUnload` instead of copying it (cuda.h).
const CU_LIBRARY_BINARY_IS_PRESERVED: CUlibraryOption = 1;

/// Our copies of images the driver may read until their library is unloaded (`CU_LIBRARY_BINARY_IS_PRESERVED`),
/// by library handle.
static PRESERVED: parking_lot::Mutex<Vec<(usize, ImageCopy)>> = parking_lot::Mutex::new(Vec::new());

/// The program's library options copied (the driver is handed ours: what it acts on is what we read), and
/// whether `CU_LIBRARY_BINARY_IS_PRESERVED` is among them. More than 16 (there are 2) or NULL arrays:
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `n` entries at `o` and `v` when not NULL.
#[allow(clippy::type_complexity)]
unsafe fn library_options(
    o: *mut CUlibraryOption,
    v: *mut *mut std::ffi::c_void,
    n: std::ffi::c_uint,
) -> Result<(Vec<CUlibraryOption>, Vec<*mut std::ffi::c_void>, bool), CUresult> {
    if n == 0 {
        return Ok((Vec::new(), Vec::new(), false));
    }
    if n > 16 || o.is_null() || v.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let (o, v) = unsafe {
        (
            std::slice::from_raw_parts(o, n as usize).to_vec(),
            std::slice::from_raw_parts(v, n as usize).to_vec(),
        )
    };
    let preserved = o.contains(&CU_LIBRARY_BINARY_IS_PRESERVED);
    Ok((o, v, preserved))
}

fn or_null<T>(v: &mut [T]) -> *mut T {
    if v.is_empty() {
        std::ptr::null_mut()
    } else {
        v.as_mut_ptr()
    }
}

/// Whether a memory cap applies to a device of this process: only then are in-memory images copied.
fn capped(s: &Shim) -> bool {
    s.devices.known().any(|(d, _)| s.mem.limit(d).is_some())
}

/// Our copy of an in-memory image (`image_copy`); `None`: refused, logged.
///
/// # Safety
/// `image` as the load calls require.
unsafe fn copied(image: *const std::ffi::c_void) -> Option<ImageCopy> {
    // SAFETY: the caller's contract.
    let c = unsafe { image_copy::copy(image) };
    if c.is_none() {
        log!(
            Level::Error,
            "image at {image:p} refused: its extent cannot be read from its headers (or passes 4 GiB), so what \
             it loads cannot be admitted under the memory cap"
        );
    }
    c
}

/// `cuModuleLoadData`, `…Ex` (with the program's options: `with` is the real call given an image),
/// `cuModuleLoadFatBinary`. Under a memory cap the driver is handed our copy of the image, whose footprint is
/// read before the call (another thread rewriting the program's image meanwhile changes neither); freed after
/// the call (the driver keeps its own). Without a cap the program's image as it is, no copy.
///
/// # Safety
/// As those calls require.
pub(crate) unsafe fn module_load_data(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    with: impl FnOnce(*const std::ffi::c_void) -> CUresult,
    module: *mut CUmodule,
    image: *const std::ffi::c_void,
) -> CUresult {
    if image.is_null() || !capped(s) {
        // SAFETY: the caller's contract.
        return unsafe { module_load(s, call, module, ImageAt::Memory(image)) };
    }
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { copied(image) }) else {
        return CUresult::ERROR_INVALID_IMAGE;
    };
    let fp = c.footprint(module_arch(s));
    // SAFETY: `c` outlives the call; `module` is the program's.
    unsafe { module_load(s, || with(c.ptr()), module, ImageAt::Known(fp)) }
}

/// `cuLibraryLoadData` (`with`: the real call given an image and library options). Under a memory cap as
/// [`module_load_data`], with our copy of the library options; a copy the driver may keep reading
/// (`CU_LIBRARY_BINARY_IS_PRESERVED`) lives until the library's `cuLibraryUnload`.
///
/// # Safety
/// As `cuLibraryLoadData` requires.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_data(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    with: impl FnOnce(
        *const std::ffi::c_void,
        *mut CUlibraryOption,
        *mut *mut std::ffi::c_void,
        std::ffi::c_uint,
    ) -> CUresult,
    library: *mut CUlibrary,
    code: *const std::ffi::c_void,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut *mut std::ffi::c_void,
    n_lib: std::ffi::c_uint,
) -> CUresult {
    if code.is_null() || !capped(s) {
        // SAFETY: the caller's contract.
        return unsafe { library_load(s, call, library, ImageAt::Memory(code)) };
    }
    // SAFETY: the caller's contract.
    let (mut o, mut v, preserved) = match unsafe { library_options(lib_options, lib_values, n_lib) } {
        Ok(x) => x,
        Err(r) => return r,
    };
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { copied(code) }) else {
        return CUresult::ERROR_INVALID_IMAGE;
    };
    let (fp, p) = (c.footprint(None), c.ptr());
    // SAFETY: `c` outlives the call (kept until unload when preserved); `library` is the program's.
    let r = unsafe {
        library_load(
            s,
            || with(p, or_null(&mut o), or_null(&mut v), n_lib),
            library,
            ImageAt::Known(fp),
        )
    };
    if r.ok() && preserved && !library.is_null() {
        // SAFETY: written by the driver on success.
        PRESERVED.lock().push((unsafe { *library } as usize, c));
    }
    r
}

/// `cuModuleLoad`, `cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`.
///
/// # Safety
/// `module` as the driver's contract says (written on success).
pub(crate) unsafe fn module_load(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    module: *mut CUmodule,
    image: ImageAt,
) -> CUresult {
    let res = match s.devices.current(&s.cuda) {
        Some(d) => match s.mem.reserve_creation(d, Creation::Module) {
            Ok(res) => Some(res),
            Err(_) => return CUresult::ERROR_OUT_OF_MEMORY,
        },
        None => None,
    };
    let r = call();
    let loaded = r.ok() && !module.is_null();
    returned(s, &res, loaded);
    if !loaded {
        return r;
    }
    // SAFETY: written by the driver on success.
    let m = unsafe { *module };
    // SAFETY: the driver accepted the image (the caller's contract).
    s.mem
        .image_loaded(m as usize, false, unsafe { image.footprint(s, module_arch(s)) });
    if s.mem.module_loaded(&s.cuda, &s.nvml, m as usize).is_err() {
        // SAFETY: unloading the module we just loaded.
        module_unload(s, || unsafe { s.cuda.cuModuleUnload(m) }, m);
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    measured(s, res);
    r
}

/// `cuModuleUnload`.
pub(crate) fn module_unload(s: &Shim, call: impl FnOnce() -> CUresult, hmod: CUmodule) -> CUresult {
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
pub(crate) unsafe fn library_load(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    library: *mut CUlibrary,
    image: ImageAt,
) -> CUresult {
    let r = call();
    if !r.ok() || library.is_null() {
        return r;
    }
    // SAFETY: written by the driver on success.
    let l = unsafe { *library };
    // SAFETY: the driver accepted the image (the caller's contract).
    s.mem
        .image_loaded(l as usize, true, unsafe { image.footprint(s, None) });
    if s.mem.library_loaded(&s.nvml).is_err() {
        // SAFETY: unloading what we just loaded.
        library_unload(s, || unsafe { s.cuda.cuLibraryUnload(l) }, l);
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// `cuLibraryUnload`.
pub(crate) fn library_unload(s: &Shim, call: impl FnOnce() -> CUresult, library: CUlibrary) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.library_unloaded(&s.nvml, library as usize);
        let mut kept = PRESERVED.lock();
        if let Some(i) = kept.iter().position(|(l, _)| *l == library as usize) {
            drop(kept.swap_remove(i));
        }
    }
    r
}
