//! `cuInit`, contexts and modules: what the driver charges a process beyond its allocations.
//!
//! A context costs hundreds of MiB of device memory (more on large GPUs) and every loaded module some more; none
//! of it goes through an allocation call. After each context creation / primary-context retain / module or
//! library load (and after each destroy / release / reset / unload) we ask NVML for this process's
//! `usedGpuMemory` on that device (`nvmlDeviceGetComputeRunningProcesses_v3`, device found by UUID) and charge
//! `used − bytes our ledger holds` as this process's overhead there. Growth on a creation path is admitted
//! against the cap: a context that alone would exceed it is undone and `CUDA_ERROR_OUT_OF_MEMORY` returned.
//!
//! Without NVML (library missing, or our pid not in its list, e.g. in a separate pid namespace with a real
//! driver) the overhead is estimated: [`CTX_ESTIMATE`] per live context and [`MODULE_ESTIMATE`] per loaded
//! module/library.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use crate::ffi::nvml::*;
use crate::log::{log, Level};
use crate::memory::Dev;
use crate::state::Shim;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicI64, Ordering};

/// Estimated device memory of one context when NVML cannot measure it.
pub const CTX_ESTIMATE: u64 = 256 << 20;
/// Estimated device memory of one loaded module or library when NVML cannot measure it.
pub const MODULE_ESTIMATE: u64 = 2 << 20;

/// What this process holds per ordinal, for the estimate and to find the device of a destroyed object.
pub struct Holdings {
    ctxs: [AtomicI64; crate::memory::MAX_ORDINALS],
    primary: [AtomicI64; crate::memory::MAX_ORDINALS],
    modules: AtomicI64,
    /// context handle → ordinal (cuCtxCreate*), module handle → ordinal.
    owners: parking_lot::Mutex<HashMap<usize, CUdevice>>,
}

impl Default for Holdings {
    fn default() -> Self {
        Holdings {
            ctxs: std::array::from_fn(|_| AtomicI64::new(0)),
            primary: std::array::from_fn(|_| AtomicI64::new(0)),
            modules: AtomicI64::new(0),
            owners: parking_lot::Mutex::new(HashMap::new()),
        }
    }
}

impl Holdings {
    /// Locks the owner map around `fork` (see `Memory::fork_prepare`).
    pub fn fork_prepare(&self) {
        std::mem::forget(self.owners.lock());
    }

    /// Undoes [`Holdings::fork_prepare`]; in the child also forgets the parent's contexts and modules.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: locked by fork_prepare, guard forgotten.
        unsafe { self.owners.force_unlock() };
        if child {
            self.owners.lock().clear();
            for c in self.ctxs.iter().chain(self.primary.iter()) {
                c.store(0, Ordering::Relaxed);
            }
            self.modules.store(0, Ordering::Relaxed);
        }
    }

    fn live_contexts(&self, ordinal: CUdevice) -> i64 {
        let o = ordinal as usize;
        self.ctxs.get(o).map_or(0, |c| c.load(Ordering::Relaxed))
            + self
                .primary
                .get(o)
                .map_or(0, |c| (c.load(Ordering::Relaxed) > 0) as i64)
    }

    fn estimate(&self, ordinal: CUdevice) -> u64 {
        let ctxs = self.live_contexts(ordinal).max(0) as u64;
        if ctxs == 0 {
            return 0;
        }
        ctxs * CTX_ESTIMATE + self.modules.load(Ordering::Relaxed).max(0) as u64 * MODULE_ESTIMATE
    }
}

/// This process's `usedGpuMemory` on `dev` per NVML: `Some(0)` when NVML lists us nowhere and we hold no
/// context there, `None` when NVML cannot tell.
fn nvml_used(s: &Shim, dev: Dev) -> Option<u64> {
    let nvml = s.nvml()?;
    let uuid = s.mem.uuid_of(dev.ordinal)?;
    let name = CString::new(cuquota_core::region::layout::format_uuid(&uuid)).ok()?;
    let mut handle: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: NUL-terminated UUID string, valid out-pointer.
    if !unsafe { nvml.nvmlDeviceGetHandleByUUID(name.as_ptr(), &mut handle) }.ok() {
        return None;
    }
    let list = process_list(nvml, handle)?;
    // SAFETY: getpid never fails.
    let me = unsafe { libc::getpid() } as u32;
    if let Some(p) = list.iter().find(|p| p.pid == me) {
        if let Some(slot) = s.mem.usage.cached_slot() {
            s.mem.usage.set_host_pid(slot, me);
        }
        return Some(p.usedGpuMemory);
    }
    (s.holdings.live_contexts(dev.ordinal) == 0).then_some(0)
}

/// The real `nvmlDeviceGetComputeRunningProcesses_v3` list, grown until it fits.
pub(crate) fn process_list(
    nvml: &crate::driver::nvml::NvmlTable,
    handle: nvmlDevice_t,
) -> Option<Vec<nvmlProcessInfo_v2_t>> {
    let mut cap: c_uint = 32;
    for _ in 0..4 {
        let mut buf = vec![nvmlProcessInfo_v2_t::default(); cap as usize];
        let mut n = cap;
        // SAFETY: `buf` has room for `n` records.
        let r = unsafe { nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, &mut n, buf.as_mut_ptr()) };
        if r.ok() {
            buf.truncate(n as usize);
            return Some(buf);
        }
        if r != nvmlReturn_t::ERROR_INSUFFICIENT_SIZE {
            return None;
        }
        cap = n.max(cap) + 16;
    }
    None
}

/// Re-measures this process's overhead on `dev`. `admit`: growth must fit under the cap.
fn measure(s: &Shim, dev: Dev, admit: bool) -> Result<(), crate::memory::OverCap> {
    let target = match nvml_used(s, dev) {
        Some(used) => used.saturating_sub(s.mem.allocated(dev)),
        None => s.holdings.estimate(dev.ordinal),
    };
    let r = s.mem.set_overhead(dev, target, admit);
    log!(
        Level::Debug,
        "device {}: overhead {} bytes ({})",
        dev.ordinal,
        target,
        if r.is_ok() { "charged" } else { "over the cap" }
    );
    r
}

/// Re-measures every device we know (library loads are context-independent).
fn measure_all(s: &Shim, admit: bool) -> Result<(), crate::memory::OverCap> {
    let devs: Vec<Dev> = s.mem.known_devices().map(|(d, _)| d).collect();
    let mut res = Ok(());
    for d in devs {
        if s.holdings.live_contexts(d.ordinal) > 0 || s.mem.overhead(d) > 0 {
            if let Err(e) = measure(s, d, admit) {
                res = Err(e);
            }
        }
    }
    res
}

/// Hook of `cuInit`: after the real one succeeds, learn every device (UUID → usage entry, limit).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuInit(s: &Shim, Flags: c_uint) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuInit(Flags) };
    if r.ok() {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        if unsafe { s.cuda.cuDeviceGetCount(&mut n) }.ok() {
            for o in 0..n.min(crate::memory::MAX_ORDINALS as c_int) {
                let _ = s.mem.device(&s.cuda, o);
            }
        }
    }
    r
}

// ---- contexts -----------------------------------------------------------------------------------------------

fn ctx_created(s: &Shim, r: CUresult, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if !r.ok() || pctx.is_null() {
        return r;
    }
    // SAFETY: written by the driver on success.
    let ctx = unsafe { *pctx };
    let Some(d) = s.mem.device(&s.cuda, dev) else {
        return r;
    };
    if let Some(c) = s.holdings.ctxs.get(dev as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    s.holdings.owners.lock().insert(ctx as usize, dev);
    if measure(s, d, true).is_err() {
        // SAFETY: destroying the context we just created.
        unsafe { cuCtxDestroy_v2(s, ctx) };
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// Hook of `cuCtxCreate` (bare, same ABI as `_v2`).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate(s: &Shim, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    ctx_created(s, unsafe { s.cuda.cuCtxCreate(pctx, flags, dev) }, pctx, dev)
}

/// Hook of `cuCtxCreate_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate_v2(s: &Shim, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    ctx_created(s, unsafe { s.cuda.cuCtxCreate_v2(pctx, flags, dev) }, pctx, dev)
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
    ctx_created(
        s,
        unsafe { s.cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev) },
        pctx,
        dev,
    )
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
    ctx_created(
        s,
        unsafe { s.cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev) },
        pctx,
        dev,
    )
}

fn ctx_destroyed(s: &Shim, ctx: CUcontext, call: impl FnOnce() -> CUresult) -> CUresult {
    let owner = s.holdings.owners.lock().remove(&(ctx as usize));
    let r = call();
    match owner {
        Some(dev) if r.ok() => {
            if let Some(c) = s.holdings.ctxs.get(dev as usize) {
                c.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(d) = s.mem.device(&s.cuda, dev) {
                contexts_gone(s, d);
                let _ = measure(s, d, false);
            }
        }
        Some(dev) => {
            s.holdings.owners.lock().insert(ctx as usize, dev);
        }
        None => {}
    }
    r
}

/// Hook of `cuCtxDestroy` (bare, same ABI as `_v2`).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxDestroy(s: &Shim, ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded unchanged.
    ctx_destroyed(s, ctx, || unsafe { s.cuda.cuCtxDestroy(ctx) })
}

/// Hook of `cuCtxDestroy_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxDestroy_v2(s: &Shim, ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded unchanged.
    ctx_destroyed(s, ctx, || unsafe { s.cuda.cuCtxDestroy_v2(ctx) })
}

/// Hook of `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRetain(s: &Shim, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuDevicePrimaryCtxRetain(pctx, dev) };
    if !r.ok() {
        return r;
    }
    let Some(d) = s.mem.device(&s.cuda, dev) else {
        return r;
    };
    if let Some(c) = s.holdings.primary.get(dev as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if measure(s, d, true).is_err() {
        // SAFETY: undoing our own retain.
        unsafe { primary_released(s, dev, |_| s.cuda.cuDevicePrimaryCtxRelease_v2(dev), false) };
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// Shared by release / reset: `reset` drops our count to zero.
unsafe fn primary_released(
    s: &Shim,
    dev: CUdevice,
    call: impl FnOnce(CUdevice) -> CUresult,
    reset: bool,
) -> CUresult {
    let r = call(dev);
    if r.ok() {
        if let Some(c) = s.holdings.primary.get(dev as usize) {
            if reset {
                c.store(0, Ordering::Relaxed);
            } else {
                let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some((v - 1).max(0)));
            }
        }
        if let Some(d) = s.mem.device(&s.cuda, dev) {
            contexts_gone(s, d);
            let _ = measure(s, d, false);
        }
    }
    r
}

/// After a context went away: if it was this process's last one on `d`, its allocations went with it. (With
/// other contexts still live on the device the records cannot tell whose allocations died: they are kept,
/// which over-counts until the process frees them or exits, never under-counts.)
fn contexts_gone(s: &Shim, d: Dev) {
    if s.holdings.live_contexts(d.ordinal) == 0 {
        s.mem.forget_context_allocations(&s.cuda, d);
    }
}

/// Hook of `cuDevicePrimaryCtxRelease` (bare).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRelease(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { primary_released(s, dev, |d| s.cuda.cuDevicePrimaryCtxRelease(d), false) }
}

/// Hook of `cuDevicePrimaryCtxRelease_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxRelease_v2(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { primary_released(s, dev, |d| s.cuda.cuDevicePrimaryCtxRelease_v2(d), false) }
}

/// Hook of `cuDevicePrimaryCtxReset` (bare).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxReset(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { primary_released(s, dev, |d| s.cuda.cuDevicePrimaryCtxReset(d), true) }
}

/// Hook of `cuDevicePrimaryCtxReset_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDevicePrimaryCtxReset_v2(s: &Shim, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    unsafe { primary_released(s, dev, |d| s.cuda.cuDevicePrimaryCtxReset_v2(d), true) }
}

// ---- modules and libraries ----------------------------------------------------------------------------------

/// After a module load: count it, re-measure the current device; over the cap → unload, OOM.
fn module_loaded(s: &Shim, r: CUresult, module: *mut CUmodule) -> CUresult {
    if !r.ok() || module.is_null() {
        return r;
    }
    s.holdings.modules.fetch_add(1, Ordering::Relaxed);
    // SAFETY: written by the driver on success.
    let m = unsafe { *module };
    let Some(d) = s.mem.current_device(&s.cuda) else {
        return r;
    };
    s.holdings.owners.lock().insert(m as usize, d.ordinal);
    if measure(s, d, true).is_err() {
        // SAFETY: unloading the module we just loaded.
        unsafe { cuModuleUnload(s, m) };
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
}

/// Hook of `cuModuleLoad`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoad(s: &Shim, module: *mut CUmodule, fname: *const c_char) -> CUresult {
    // SAFETY: forwarded unchanged.
    module_loaded(s, unsafe { s.cuda.cuModuleLoad(module, fname) }, module)
}

/// Hook of `cuModuleLoadData`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoadData(s: &Shim, module: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: forwarded unchanged.
    module_loaded(s, unsafe { s.cuda.cuModuleLoadData(module, image) }, module)
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
    let r = unsafe {
        s.cuda
            .cuModuleLoadDataEx(module, image, numOptions, options, optionValues)
    };
    module_loaded(s, r, module)
}

/// Hook of `cuModuleLoadFatBinary`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleLoadFatBinary(s: &Shim, module: *mut CUmodule, fatCubin: *const c_void) -> CUresult {
    // SAFETY: forwarded unchanged.
    module_loaded(
        s,
        unsafe { s.cuda.cuModuleLoadFatBinary(module, fatCubin) },
        module,
    )
}

/// Hook of `cuModuleUnload`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuModuleUnload(s: &Shim, hmod: CUmodule) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuModuleUnload(hmod) };
    if r.ok() {
        let _ = s
            .holdings
            .modules
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some((v - 1).max(0)));
        let owner = s.holdings.owners.lock().remove(&(hmod as usize));
        if let Some(d) = owner.and_then(|o| s.mem.device(&s.cuda, o)) {
            let _ = measure(s, d, false);
        }
    }
    r
}

fn library_loaded(s: &Shim, r: CUresult, library: *mut CUlibrary) -> CUresult {
    if !r.ok() || library.is_null() {
        return r;
    }
    s.holdings.modules.fetch_add(1, Ordering::Relaxed);
    if measure_all(s, true).is_err() {
        // SAFETY: written by the driver on success; unloading what we just loaded.
        unsafe { cuLibraryUnload(s, *library) };
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    r
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
    let r = unsafe {
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
    };
    library_loaded(s, r, library)
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
    let r = unsafe {
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
    };
    library_loaded(s, r, library)
}

/// Hook of `cuLibraryUnload`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuLibraryUnload(s: &Shim, library: CUlibrary) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuLibraryUnload(library) };
    if r.ok() {
        let _ = s
            .holdings
            .modules
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some((v - 1).max(0)));
        let _ = measure_all(s, false);
    }
    r
}
