//! The throttle inside the preload library: per-process state (engine, probes, SM limits per CUDA ordinal), the
//! fast "is anything limited?" check, and the one function every launch hook goes through.
//!
//! Why a `static` of its own rather than a field of `Shim`: the launch hooks are the only users, and keeping the
//! state here leaves `state.rs` untouched. It is built on the first launch from the `Shim` (configuration, usage
//! region, libraries).
//!
//! Cost when no SM limit applies (0, 100, unset, DISABLE): one `OnceLock` load, one atomic load per agent limits
//! file (did its `seq` move?), one flag — then the real call. With a limit: `cuCtxGetDevice`, the limit word, a
//! clock read, an estimate lookup, one CAS on the bucket and three counter adds.

use super::bucket::{slot, FULL_RATE};
use super::burst;
use super::clock::{monotonic_ns, Monotonic};
use super::engine::{Engine, Gpu, Shared, Ticket};
use super::estimate::launch_key;
use super::probe::{EventApi, EventProbes, STREAM_LEGACY, STREAM_PER_THREAD};
use super::{Limit, Policy};
use crate::ffi::cuda::{CUdevice, CUresult};
use crate::ffi::nvml::{nvmlDevice_t, nvmlProcessUtilizationSample_t, nvmlReturn_t};
use crate::log::{log, Level};
use crate::state::Shim;
use cuquota_core::region::EffectiveLimits;
use cuquota_core::DeviceId;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// CUDA ordinals with their own limit word (higher ordinals share the last one's lookup path, uncached).
const ORDINALS: usize = 64;
/// Limit word: 0 = not computed yet; else `1 | pct << 8 | policy << 16 | weight << 24` (pct 0 = none).
const UNKNOWN: u64 = 0;

fn pack(l: Limit) -> u64 {
    let p = match l.policy {
        Policy::Hard => 1u64,
        Policy::Burst => 2,
        Policy::Disabled => 3,
    };
    1 | ((l.pct.min(255) as u64) << 8) | (p << 16) | ((l.weight.min(0xffff) as u64) << 24)
}

fn unpack(w: u64) -> Limit {
    let policy = match (w >> 16) & 0xff {
        1 => Policy::Hard,
        3 => Policy::Disabled,
        _ => Policy::Burst,
    };
    Limit {
        pct: ((w >> 8) & 0xff) as u32,
        policy,
        weight: ((w >> 24) & 0xffff) as u32,
    }
}

/// The SM limit of ordinal `o` from env/config and the agent files (lower limit, stricter policy wins; see
/// `Memory::effective`). `GPU_CORE_UTILIZATION_POLICY=DISABLE` only drops the process's own limits
/// (`Config::sm_limit` is then `None`): nothing in a process's environment lifts what the agent wrote.
fn effective(s: &Shim, o: u32, uuid: Option<&[u8; 16]>) -> Limit {
    let eff = match uuid {
        Some(u) => s.mem.effective(Some(o), u),
        None => EffectiveLimits::from_config(s.mem.config(), o),
    };
    let policy = match eff.policy {
        Some(cuquota_core::Policy::Hard) => Policy::Hard,
        Some(cuquota_core::Policy::Burst) => Policy::Burst,
        None => Policy::default(),
    };
    match eff.sm {
        Some(pct) => Limit {
            pct,
            policy,
            weight: eff.weight.unwrap_or(100),
        },
        _ => Limit::NONE,
    }
}

type ProcSample = nvmlProcessUtilizationSample_t;
type ProcUtilFn = unsafe extern "C" fn(nvmlDevice_t, *mut ProcSample, *mut c_uint, u64) -> nvmlReturn_t;
type HandleByUuidFn = unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;

/// Other containers' use of a device, for the burst controller: NVML's per-process utilisation since the last
/// sample, summed over the processes that are not members of this container's usage region.
struct Util {
    proc_util: Option<ProcUtilFn>,
    by_uuid: Option<HandleByUuidFn>,
    /// This container's usage region (its own mapping), for membership.
    usage: Option<cuquota_core::UsageRegion>,
    /// Usage entry → NVML handle (0 = unknown yet, 1 = unavailable).
    handles: [AtomicUsize; 16],
    /// Usage entry → CLOCK_REALTIME µs of the previous sample.
    last_seen: [AtomicU64; 16],
    /// Usage entry → UUID string, filled when the ordinal is first seen.
    uuids: Mutex<[Option<CString>; 16]>,
}

fn realtime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

impl Util {
    fn handle(&self, dev: usize) -> Option<*mut c_void> {
        let mut h = self.handles[dev % 16].load(Ordering::Relaxed);
        if h == 0 {
            let uuid = self.uuids.lock().ok()?[dev % 16].clone();
            let mut p: *mut c_void = std::ptr::null_mut();
            h = match (uuid, self.by_uuid) {
                // SAFETY: NUL-terminated UUID string, valid out-pointer; NVML was initialised by the shim.
                (Some(u), Some(f)) if unsafe { f(u.as_ptr(), &mut p) }.ok() && !p.is_null() => p as usize,
                _ => 1,
            };
            self.handles[dev % 16].store(h, Ordering::Relaxed);
        }
        (h != 1).then_some(h as *mut c_void)
    }

    fn others_pm(&self, dev: usize) -> Option<u64> {
        let (f, usage) = (self.proc_util?, self.usage.as_ref()?);
        let h = self.handle(dev)?;
        let now = realtime_us();
        let last = self.last_seen[dev % 16].swap(now, Ordering::Relaxed);
        let since = if last == 0 {
            now.saturating_sub(burst::SAMPLE_NS / 1000)
        } else {
            last
        };
        let mut buf = [ProcSample::default(); 128];
        let mut n = buf.len() as c_uint;
        // SAFETY: a handle NVML gave us, a buffer of `n` samples, valid count pointer.
        let r = unsafe { f(h, buf.as_mut_ptr(), &mut n, since) };
        // NVML_ERROR_NOT_FOUND: no samples since `since` = nobody ran.
        if r == nvmlReturn_t::ERROR_NOT_FOUND {
            return Some(0);
        }
        if !r.ok() {
            return None;
        }
        // Average each pid's samples, sum over the pids outside this container.
        let mut per: Vec<(u32, u64, u64)> = Vec::new();
        for smp in &buf[..(n as usize).min(buf.len())] {
            match per.iter_mut().find(|x| x.0 == smp.pid) {
                Some(x) => {
                    x.1 += smp.smUtil as u64;
                    x.2 += 1;
                }
                None => per.push((smp.pid, smp.smUtil as u64, 1)),
            }
        }
        let others: u64 = per
            .iter()
            .filter(|(pid, _, _)| !usage.is_member(*pid))
            .map(|(_, sum, k)| sum * 10 / k)
            .sum();
        Some(others.min(FULL_RATE))
    }
}

/// Per-process throttle state.
pub struct SmThrottle {
    engine: Engine,
    probes: Option<EventProbes>,
    util: &'static Util,
    /// Some limit can apply at all (env/config has an SM limit, or an agent limits file exists).
    possible: bool,
    /// Env/config set an SM limit for some ordinal.
    config_limited: bool,
    /// Some ordinal seen so far is limited (recomputed on a limits-file change).
    any_active: AtomicBool,
    /// `Memory::poll_limits` generation the cached limits were computed at.
    limits_generation: AtomicU64,
    limits: [AtomicU64; ORDINALS],
    /// Usage entry of each ordinal + 1 (0 = unknown).
    entry: [AtomicU64; ORDINALS],
    /// The process sees exactly one device: every launch is on ordinal 0 (saves a `cuCtxGetDevice`).
    single_device: bool,
}

static THROTTLE: OnceLock<SmThrottle> = OnceLock::new();

/// The process's throttle, built on first use.
#[inline]
pub fn get(s: &Shim) -> &'static SmThrottle {
    THROTTLE.get_or_init(|| SmThrottle::new(s))
}

impl SmThrottle {
    fn new(s: &Shim) -> SmThrottle {
        let cfg = s.mem.config();
        let config_limited = !cfg.sm_disabled
            && (cfg.default_limits.sm.is_some() || cfg.devices.values().any(|d| d.sm.is_some()));
        let possible = config_limited || s.mem.has_agent_files();
        let c = &s.cuda;
        let probes = (|| {
            Some(EventApi {
                cuEventCreate: c.cuEventCreate?,
                cuEventDestroy: c.cuEventDestroy_v2?,
                cuEventRecord: c.cuEventRecord?,
                cuEventQuery: c.cuEventQuery?,
                cuEventElapsedTime: c.cuEventElapsedTime_v2.or(c.cuEventElapsedTime)?,
                cuStreamGetCtx: c.cuStreamGetCtx?,
                cuCtxGetCurrent: c.cuCtxGetCurrent?,
                cuCtxPushCurrent: c.cuCtxPushCurrent_v2?,
                cuCtxPopCurrent: c.cuCtxPopCurrent_v2?,
            })
        })();
        let nvml = s.nvml();
        let util: &'static Util = Box::leak(Box::new(Util {
            proc_util: nvml.and_then(|n| n.nvmlDeviceGetProcessUtilization),
            by_uuid: nvml.and_then(|n| n.nvmlDeviceGetHandleByUUID),
            usage: cuquota_core::UsageRegion::open_existing(&cfg.usage_path).ok(),
            handles: Default::default(),
            last_seen: Default::default(),
            uuids: Mutex::new(Default::default()),
        }));
        let probes = probes.map(|api| EventProbes::new(api, Box::new(move |d| util.others_pm(d))));
        if probes.is_none() && possible {
            log!(
                Level::Warn,
                "CUDA events unavailable: SM limits charge estimates only"
            );
        }
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; the driver is initialised (a launch is being made).
        let single_device = unsafe { s.cuda.cuDeviceGetCount(&mut n) }.ok() && n == 1;
        SmThrottle {
            single_device,
            engine: Engine::new(),
            probes,
            util,
            possible,
            config_limited,
            any_active: AtomicBool::new(config_limited || s.mem.agent_sets_sm_limit()),
            limits_generation: AtomicU64::new(s.mem.poll_limits()),
            limits: std::array::from_fn(|_| AtomicU64::new(UNKNOWN)),
            entry: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Could any launch be throttled right now? (The no-limit fast path.)
    #[inline]
    pub fn active(&self, s: &Shim) -> bool {
        if !self.possible {
            return false;
        }
        self.refresh_if_changed(s);
        self.any_active.load(Ordering::Relaxed)
    }

    /// Picks up an agent limits-file change (`Memory` watches the files; one atomic load per file).
    #[inline]
    fn refresh_if_changed(&self, s: &Shim) {
        let g = s.mem.poll_limits();
        if g != self.limits_generation.load(Ordering::Relaxed) {
            self.limits_generation.store(g, Ordering::Relaxed);
            self.refresh(s);
        }
    }

    #[cold]
    fn refresh(&self, s: &Shim) {
        // Every cached limit is recomputed on next use; "any" turns on if a file names an SM limit anywhere.
        for l in &self.limits {
            l.store(UNKNOWN, Ordering::Relaxed);
        }
        self.any_active.store(
            s.mem.agent_sets_sm_limit() || self.config_limited,
            Ordering::Relaxed,
        );
        log!(Level::Info, "SM limits: limits file changed, recomputing");
    }

    /// Limit and usage entry for CUDA ordinal `o` (cached; recomputed after a limits-file change).
    fn limit_of(&self, s: &Shim, o: CUdevice) -> Option<(Limit, DeviceId)> {
        let i = usize::try_from(o).ok().filter(|&i| i < ORDINALS)?;
        let dev = s.mem.device(&s.cuda, o)?;
        let w = self.limits[i].load(Ordering::Relaxed);
        let lim = if w == UNKNOWN {
            let uuid = s.mem.uuid_of(o);
            let lim = effective(s, o as u32, uuid.as_ref());
            self.limits[i].store(pack(lim), Ordering::Relaxed);
            if self.entry[i].swap(dev.id.index() as u64 + 1, Ordering::Relaxed) == 0 {
                if let (Some(u), Ok(mut names)) = (uuid, self.util.uuids.lock()) {
                    names[dev.id.index() % 16] = CString::new(format_gpu_uuid(&u)).ok();
                }
            }
            s.mem.usage.throttle(dev.id)[slot::CONFIG].store(lim.pack(), Ordering::Relaxed);
            if lim.active() {
                self.any_active.store(true, Ordering::Relaxed);
                log!(
                    Level::Info,
                    "device {o}: SM limit {}% ({:?}, weight {})",
                    lim.pct,
                    lim.policy,
                    lim.weight
                );
            }
            lim
        } else {
            unpack(w)
        };
        Some((lim, dev.id))
    }

    /// Throttle one launch on the current context's device: admit (maybe sleeping), measure a sample, call.
    ///
    /// `streams`: the streams the launch uses (for probes); `launch` does the real call.
    pub fn launch(&self, s: &Shim, key: u64, stream: usize, launch: impl FnOnce() -> CUresult) -> CUresult {
        let mut ord: CUdevice = 0;
        // SAFETY: valid out-pointer.
        if !self.single_device && !unsafe { s.cuda.cuCtxGetDevice(&mut ord) }.ok() {
            return launch();
        }
        self.launch_on(s, ord, key, stream, launch)
    }

    /// As [`launch`](Self::launch) for a known CUDA ordinal.
    pub fn launch_on(
        &self,
        s: &Shim,
        ord: CUdevice,
        key: u64,
        stream: usize,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Some((lim, id)) = self.limit_of(s, ord) else {
            return launch();
        };
        if !lim.active() {
            return launch();
        }
        let sh = self.shared(s, id);
        let Some(t) = self.admit(s, ord, id, lim, key, &sh) else {
            return launch();
        };
        self.run(s, &sh, t, stream, launch)
    }

    /// Takes the launch's tokens on `ord` (maybe sleeping), measuring with events when the driver has them.
    fn admit(
        &self,
        s: &Shim,
        ord: CUdevice,
        id: DeviceId,
        lim: Limit,
        key: u64,
        sh: &Shared<'_>,
    ) -> Option<Ticket> {
        let relimit = || self.relimit(s, ord, ord as usize, lim);
        match &self.probes {
            Some(p) => self.engine.admit(id.index(), sh, relimit, key, &Monotonic, p),
            None => self
                .engine
                .admit(id.index(), sh, relimit, key, &Monotonic, &NoGpu),
        }
    }

    fn relimit(&self, s: &Shim, ord: CUdevice, i: usize, fallback: Limit) -> Limit {
        self.refresh_if_changed(s);
        let w = self.limits[i].load(Ordering::Relaxed);
        if w == UNKNOWN {
            return self.limit_of(s, ord).map_or(fallback, |(l, _)| l);
        }
        unpack(w)
    }

    fn shared<'a>(&self, s: &'a Shim, id: DeviceId) -> Shared<'a> {
        let usage = &s.mem.usage;
        let slot = usage.cached_slot().or_else(|| usage.process_slot().ok());
        Shared {
            words: usage.throttle(id),
            busy_ns: usage.busy_ns(id),
            gpu_ns: slot.map(|sl| usage.gpu_ns(sl, id)),
            throttled_ns: usage.throttled_ns(id),
        }
    }

    fn run(
        &self,
        _s: &Shim,
        sh: &Shared<'_>,
        t: Ticket,
        stream: usize,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let handle = match (&self.probes, t.probe) {
            (Some(p), true) => p.probe_begin(t.dev, stream),
            _ => 0,
        };
        if t.probe && handle == 0 {
            self.engine.probe_abandon(t.dev);
        }
        let r = launch();
        if !r.ok() {
            if handle != 0 {
                self.engine.probe_abandon(t.dev);
            }
            self.engine.refund(sh, &Ticket { probe: false, ..t });
            return r;
        }
        if handle != 0 {
            if let Some(p) = &self.probes {
                if p.probe_end(handle, stream) {
                    self.engine.probe_issued(&t, handle, monotonic_ns());
                } else {
                    self.engine.probe_abandon(t.dev);
                }
            }
        }
        r
    }

    /// The CUDA ordinal a stream's work runs on (its context's device); falls back to the current context.
    pub fn stream_device(&self, s: &Shim, stream: usize) -> Option<CUdevice> {
        let stream = stream as *mut c_void;
        let mut ord: CUdevice = -1;
        let special =
            stream.is_null() || stream as usize == STREAM_LEGACY || stream as usize == STREAM_PER_THREAD;
        if let (Some(api), false) = (self.probes.as_ref().map(|p| *p.api()), special) {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            let mut cur: *mut c_void = std::ptr::null_mut();
            // SAFETY: the program's stream handle and valid out-pointers.
            if unsafe { (api.cuStreamGetCtx)(stream, &mut ctx) }.ok()
                && !ctx.is_null()
                // SAFETY: valid out-pointer.
                && unsafe { (api.cuCtxGetCurrent)(&mut cur) }.ok()
            {
                // SAFETY: `ctx` is the live context of the program's stream; popped right after.
                let pushed = cur != ctx && unsafe { (api.cuCtxPushCurrent)(ctx) }.ok();
                if cur == ctx || pushed {
                    // SAFETY: valid out-pointer.
                    let ok = unsafe { s.cuda.cuCtxGetDevice(&mut ord) }.ok();
                    if pushed {
                        let mut p: *mut c_void = std::ptr::null_mut();
                        // SAFETY: undoes our push.
                        unsafe { (api.cuCtxPopCurrent)(&mut p) };
                    }
                    if ok {
                        return Some(ord);
                    }
                }
            }
        }
        // SAFETY: valid out-pointer.
        unsafe { s.cuda.cuCtxGetDevice(&mut ord) }.ok().then_some(ord)
    }

    /// Multi-device launch: admit on every device first (in order), then launch once.
    pub fn launch_multi(
        &self,
        s: &Shim,
        parts: &[(CUdevice, u64, usize)],
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let mut admitted: Vec<(Shared<'_>, Ticket, usize)> = Vec::with_capacity(parts.len());
        for &(ord, key, stream) in parts {
            let Some((lim, id)) = self.limit_of(s, ord) else {
                continue;
            };
            if !lim.active() {
                continue;
            }
            let sh = self.shared(s, id);
            let t = self.admit(s, ord, id, lim, key, &sh);
            if let Some(t) = t {
                admitted.push((sh, t, stream));
            }
        }
        let handles: Vec<u64> = admitted
            .iter()
            .map(|(_, t, st)| match (&self.probes, t.probe) {
                (Some(p), true) => {
                    let h = p.probe_begin(t.dev, *st);
                    if h == 0 {
                        self.engine.probe_abandon(t.dev);
                    }
                    h
                }
                _ => 0,
            })
            .collect();
        let r = launch();
        for ((sh, t, st), h) in admitted.iter().zip(handles) {
            if !r.ok() {
                if h != 0 {
                    self.engine.probe_abandon(t.dev);
                }
                self.engine.refund(sh, &Ticket { probe: false, ..*t });
            } else if h != 0 {
                match &self.probes {
                    Some(p) if p.probe_end(h, *st) => self.engine.probe_issued(t, h, monotonic_ns()),
                    _ => self.engine.probe_abandon(t.dev),
                }
            }
        }
        r
    }
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (NVML's UUID spelling).
fn format_gpu_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// No events available: nothing is measured, estimates stay at their fallback.
struct NoGpu;

impl Gpu for NoGpu {
    fn probe_begin(&self, _dev: usize, _stream: usize) -> u64 {
        0
    }
    fn probe_end(&self, _p: u64, _stream: usize) -> bool {
        false
    }
    fn probe_poll(&self, _p: u64) -> super::engine::Poll {
        super::engine::Poll::Failed
    }
    fn probe_release(&self, _p: u64) {}
    fn others_busy_pm(&self, _dev: usize) -> Option<u64> {
        None
    }
}

/// Key of a kernel launch (function, grid, block).
#[inline]
pub fn kernel_key(f: *mut c_void, grid: [u32; 3], block: [u32; 3]) -> u64 {
    let g = grid.iter().map(|&x| x as u64).product::<u64>();
    let b = block.iter().map(|&x| x as u64).product::<u64>();
    launch_key(f as usize, g, b)
}
