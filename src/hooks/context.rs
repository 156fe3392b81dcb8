//! `cuInit`, contexts and modules: what the driver charges a process beyond its allocations.
//!
//! A context costs hundreds of MiB of device memory (more on large GPUs) and every loaded module some more; none
//! of it goes through an allocation call. After each context creation / primary-context retain / module or
//! library load (and after each destroy / release / reset / unload) we ask NVML for this process's
//! `usedGpuMemory` on that device (`nvmlDeviceGetComputeRunningProcesses_v3`, device found by UUID) and charge
//! `used − bytes our ledger holds` as this process's overhead there. Growth on a creation path is admitted
//! against the cap: a context that alone would exceed it is undone and `CUDA_ERROR_OUT_OF_MEMORY` returned.
//!
//! In a separate pid namespace (a Kubernetes pod) NVML lists host pids, not ours. When our own pid is not in
//! its list, the host pid is learned by diffing NVML's process list around this process's first context
//! creation on a device ([`HostPid`]); it is then what we look for in NVML's lists, and it is recorded in our
//! usage slot so the NVML filter and the burst controller recognise us.
//!
//! Without NVML (library missing, or our pid not in its list and the host pid not learned) the overhead is
//! estimated: [`CTX_ESTIMATE`] per live context and [`MODULE_ESTIMATE`] per loaded module/library.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use crate::ffi::nvml::*;
use crate::log::{log, Level};
use crate::memory::Dev;
use crate::state::Shim;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

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
    /// The pid NVML knows us by.
    pub(crate) host: HostPid,
}

/// The pid NVML reports for this process (its pid in the host's namespace), learned by diffing NVML's process
/// list around our first context creation on a device. Touched only on context creation and module load, and
/// only while unknown.
#[derive(Default)]
pub struct HostPid {
    /// The learned host pid (0 = unknown).
    pid: AtomicU32,
    /// Bit per ordinal (< 64): a context creation on that device has started in this process. Only the first
    /// one may diff: before it, NVML cannot list us on that device, so we are among the pids it adds.
    touched: AtomicU64,
    /// One learner at a time in this process (a concurrent context creation by another thread of ours only
    /// adds our own pid, which is harmless).
    busy: AtomicBool,
    /// After an ambiguous diff: (ordinal, the new pids, us among them), narrowed at later attempts as the
    /// others become known members of the container or leave.
    candidates: parking_lot::Mutex<Option<(CUdevice, Vec<u32>)>>,
}

impl HostPid {
    /// The learned host pid, if any (one atomic load).
    pub fn get(&self) -> Option<u32> {
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    fn try_begin(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    fn end(&self) {
        self.busy.store(false, Ordering::Release);
    }
}

/// The one pid among `after` that is new since `before` and not already a member of the container (a host
/// pid another process of ours recorded). `Err` with the new non-member pids when there is not exactly one
/// (none, or several processes started contexts at the same moment).
pub fn new_host_pid(before: &[u32], after: &[u32], members: &[u32]) -> Result<u32, Vec<u32>> {
    let mut new: Vec<u32> = after
        .iter()
        .copied()
        .filter(|p| *p != 0 && !before.contains(p) && !members.contains(p))
        .collect();
    new.sort_unstable();
    new.dedup();
    match new[..] {
        [p] => Ok(p),
        _ => Err(new),
    }
}

impl Default for Holdings {
    fn default() -> Self {
        Holdings {
            ctxs: std::array::from_fn(|_| AtomicI64::new(0)),
            primary: std::array::from_fn(|_| AtomicI64::new(0)),
            modules: AtomicI64::new(0),
            owners: parking_lot::Mutex::new(HashMap::new()),
            host: HostPid::default(),
        }
    }
}

impl Holdings {
    /// Locks the owner map around `fork` (see `Memory::fork_prepare`).
    pub fn fork_prepare(&self) {
        std::mem::forget(self.owners.lock());
        std::mem::forget(self.host.candidates.lock());
    }

    /// Undoes [`Holdings::fork_prepare`]; in the child also forgets the parent's contexts and modules.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: locked by fork_prepare, guard forgotten.
        unsafe {
            self.owners.force_unlock();
            self.host.candidates.force_unlock();
        }
        if child {
            self.owners.lock().clear();
            // The child is another process: NVML knows it by another pid, to be learned again.
            self.host.pid.store(0, Ordering::Relaxed);
            self.host.touched.store(0, Ordering::Relaxed);
            self.host.busy.store(false, Ordering::Relaxed);
            *self.host.candidates.lock() = None;
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

/// NVML's handle for the device of CUDA ordinal `ordinal`.
fn nvml_handle(s: &Shim, ordinal: CUdevice) -> Option<(&crate::driver::nvml::NvmlTable, nvmlDevice_t)> {
    let nvml = s.nvml()?;
    let uuid = s.mem.uuid_of(ordinal)?;
    let name = CString::new(cuquota_core::region::layout::format_uuid(&uuid)).ok()?;
    let mut handle: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: NUL-terminated UUID string, valid out-pointer.
    if !unsafe { nvml.nvmlDeviceGetHandleByUUID(name.as_ptr(), &mut handle) }.ok() {
        return None;
    }
    Some((nvml, handle))
}

/// This process's `usedGpuMemory` on `dev` per NVML: `Some(0)` when NVML lists us nowhere and we hold no
/// context there, `None` when NVML cannot tell. We are the entry with our pid, else with our learned host pid.
fn nvml_used(s: &Shim, dev: Dev) -> Option<u64> {
    let (nvml, handle) = nvml_handle(s, dev.ordinal)?;
    let list = process_list(nvml, handle)?;
    // SAFETY: getpid never fails.
    let me = unsafe { libc::getpid() } as u32;
    let found = list.iter().find(|p| p.pid == me).or_else(|| {
        let host = s.holdings.host.get()?;
        list.iter().find(|p| p.pid == host)
    });
    if let Some(p) = found {
        if p.pid == me && s.holdings.host.get().is_none() {
            learned(s, me);
        } else if let Some(slot) = s.mem.usage.cached_slot() {
            s.mem.usage.set_host_pid(slot, p.pid);
        }
        return Some(p.usedGpuMemory);
    }
    (s.holdings.live_contexts(dev.ordinal) == 0).then_some(0)
}

/// The pids NVML lists on the device of `ordinal`.
fn nvml_pids(s: &Shim, ordinal: CUdevice) -> Option<Vec<u32>> {
    let (nvml, handle) = nvml_handle(s, ordinal)?;
    Some(process_list(nvml, handle)?.iter().map(|p| p.pid).collect())
}

/// Host pids other live processes of the container recorded in their usage slots.
fn member_host_pids(s: &Shim) -> Vec<u32> {
    s.mem
        .usage
        .processes()
        .into_iter()
        .filter(|p| p.state == cuquota_core::region::SlotState::Live && p.host_pid != 0)
        .map(|p| p.host_pid)
        .collect()
}

/// Records our host pid: in the process state and in our usage slot (claimed if needed).
fn learned(s: &Shim, pid: u32) {
    s.holdings.host.pid.store(pid, Ordering::Release);
    *s.holdings.host.candidates.lock() = None;
    match s.mem.usage.process_slot() {
        Ok(slot) => s.mem.usage.set_host_pid(slot, pid),
        Err(e) => log!(Level::Warn, "host pid {pid} not recorded: no usage slot ({e})"),
    }
}

/// Before a context creation on `dev`: when our host pid is unknown and this is our first context creation
/// on the device, NVML's pids on it (the diff's "before"). Otherwise retries an earlier ambiguous diff.
fn host_pid_before(s: &Shim, dev: CUdevice) -> Option<Vec<u32>> {
    let host = &s.holdings.host;
    if host.get().is_some() {
        return None;
    }
    let bit = 1u64.checked_shl(u32::try_from(dev).ok()?)?;
    if host.touched.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
        retry_host_pid(s);
        return None;
    }
    if !host.try_begin() {
        return None;
    }
    let before = nvml_pids(s, dev);
    // SAFETY: getpid never fails.
    let me = unsafe { libc::getpid() } as u32;
    match before {
        Some(b) if !b.contains(&me) => Some(b),
        _ => {
            host.end();
            None
        }
    }
}

/// After the context creation that [`host_pid_before`] prepared (`before` is `Some`): diffs NVML's list.
fn host_pid_after(s: &Shim, dev: CUdevice, before: Option<Vec<u32>>, created: bool) {
    let Some(before) = before else {
        return;
    };
    let host = &s.holdings.host;
    if created {
        if let Some(after) = nvml_pids(s, dev) {
            // SAFETY: getpid never fails.
            let me = unsafe { libc::getpid() } as u32;
            if after.contains(&me) {
                learned(s, me);
            } else {
                match new_host_pid(&before, &after, &member_host_pids(s)) {
                    Ok(p) => {
                        log!(Level::Debug, "device {dev}: NVML knows this process as pid {p}");
                        learned(s, p);
                    }
                    Err(new) => {
                        log!(
                            Level::Debug,
                            "device {dev}: host pid ambiguous (new NVML pids {new:?}); retried later"
                        );
                        if new.len() >= 2 {
                            *host.candidates.lock() = Some((dev, new));
                        }
                    }
                }
            }
        }
    }
    host.end();
}

/// Retries an ambiguous diff: of its new pids, those NVML still lists on that device and that no other
/// process of the container has recorded; exactly one left → that is us. Needs a live context of ours on
/// the device (so that we are still listed there).
fn retry_host_pid(s: &Shim) {
    let host = &s.holdings.host;
    if host.get().is_some() || !host.try_begin() {
        return;
    }
    let pending = host.candidates.lock().clone();
    if let Some((dev, cands)) = pending {
        if s.holdings.live_contexts(dev) > 0 {
            if let Some(now) = nvml_pids(s, dev) {
                let still: Vec<u32> = cands.into_iter().filter(|p| now.contains(p)).collect();
                match new_host_pid(&[], &still, &member_host_pids(s)) {
                    Ok(p) => {
                        log!(
                            Level::Debug,
                            "device {dev}: NVML knows this process as pid {p} (retry)"
                        );
                        learned(s, p);
                    }
                    Err(left) => {
                        log!(Level::Debug, "device {dev}: host pid still ambiguous ({left:?})");
                        *host.candidates.lock() = (left.len() >= 2).then_some((dev, left));
                    }
                }
            }
        }
    }
    host.end();
}

/// Runs a context-creating driver call on `dev`, learning our host pid around it when needed.
fn creating(s: &Shim, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let before = host_pid_before(s, dev);
    let r = call();
    host_pid_after(s, dev, before, r.ok());
    r
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
    let r = creating(s, dev, || unsafe { s.cuda.cuCtxCreate(pctx, flags, dev) });
    ctx_created(s, r, pctx, dev)
}

/// Hook of `cuCtxCreate_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuCtxCreate_v2(s: &Shim, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = creating(s, dev, || unsafe { s.cuda.cuCtxCreate_v2(pctx, flags, dev) });
    ctx_created(s, r, pctx, dev)
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
    let r = creating(s, dev, || unsafe {
        s.cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev)
    });
    ctx_created(s, r, pctx, dev)
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
    let r = creating(s, dev, || unsafe {
        s.cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev)
    });
    ctx_created(s, r, pctx, dev)
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
    let r = creating(s, dev, || unsafe { s.cuda.cuDevicePrimaryCtxRetain(pctx, dev) });
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
    if s.holdings.host.get().is_none() {
        retry_host_pid(s);
    }
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
    if s.holdings.host.get().is_none() {
        retry_host_pid(s);
    }
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

#[cfg(test)]
mod host_pid_tests {
    use super::new_host_pid;

    #[test]
    fn exactly_one_new_pid_is_us() {
        assert_eq!(new_host_pid(&[], &[100_007], &[]), Ok(100_007));
        assert_eq!(
            new_host_pid(&[200_001, 200_002], &[200_001, 100_007, 200_002], &[]),
            Ok(100_007)
        );
        // listed twice (NVML lists a process once per context on some drivers): still one pid
        assert_eq!(new_host_pid(&[5], &[5, 9, 9], &[]), Ok(9));
    }

    #[test]
    fn pids_known_to_the_container_are_not_candidates() {
        // a sibling started its context at the same moment but has already recorded its host pid
        assert_eq!(new_host_pid(&[], &[100_007, 100_008], &[100_008]), Ok(100_007));
        assert_eq!(new_host_pid(&[1], &[1, 100_008], &[100_008]), Err(vec![]));
    }

    #[test]
    fn ambiguous_or_empty_diffs_learn_nothing() {
        assert_eq!(new_host_pid(&[], &[], &[]), Err(vec![]));
        assert_eq!(new_host_pid(&[3, 4], &[3, 4], &[]), Err(vec![]));
        assert_eq!(
            new_host_pid(&[3], &[3, 100_009, 100_007], &[]),
            Err(vec![100_007, 100_009])
        );
        // pid 0 (NVML's "unknown") is never us
        assert_eq!(new_host_pid(&[], &[0], &[]), Err(vec![]));
    }
}
