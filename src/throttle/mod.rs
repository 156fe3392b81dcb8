//! SM-time limiting: each container gets its percentage of a device's *time*, measured in GPU nanoseconds.
//!
//! Why GPU time and not thread blocks (HAMi-core's unit): a block's cost depends on the kernel and on how many
//! SMs the device has, so block tokens under-throttle big GPUs and mis-split mixed workloads. GPU time is what
//! time-slicing shares, so it is the one unit in which "30 %" means the same thing on every device.
//!
//! Pieces:
//! - [`SmThrottle`] (here): the process's throttle state, part of the shim's state like the memory ledger; the
//!   one function every launch hook goes through. Limits come from `crate::devices` (the device's effective
//!   `Policy`, the same the memory accounting uses).
//! - [`bucket`]: the container's token bucket per device, one atomic word in the shared usage region
//!   (`throttle[8]`), earned at `limit × wall time`, burst bounded to 10 ms of wall time at the limit's rate;
//! - [`estimate`]: per-process duration estimates per (function, grid, block), refined by measurements;
//! - [`engine`]: admission of one launch (charge the estimate, sleep while the bucket is in debt), sampled
//!   measurement with CUDA events (probes) and reconciliation (measured − charged back to the bucket);
//! - [`probe`]: the CUDA event pairs; [`util`]: NVML utilisation (other containers', this process's);
//! - [`sampler`]: the thread that reads NVML every 200 ms once a limited launch was probed (the charge's floor);
//! - [`burst`]: the work-conserving policy's controller (device utilisation minus own use → effective rate);
//! - [`clock`]: the monotonic clock and the sleeping wait, behind a trait for tests;
//! - [`priority`]: high-priority tenants publish their launches in their container's priority file, best-effort
//!   tenants yield to them (docs/priority.md);
//! - [`stream`]: which device a launch runs on (its stream's, not the current context's).
//!
//! Cost when no SM limit and no priority applies (0, 100, unset, DISABLE): one atomic load per agent limits
//! file (did its `seq` move?) and one flag, then the real call. With a limit: `cuStreamGetDevice`
//! (`cuCtxGetDevice` for the NULL stream; `cuStreamGetCtx` and a cache lookup on drivers before 12.8; nothing
//! with one visible device), the device's policy words, a clock read, an estimate lookup, one CAS on the bucket
//! and three counter adds. A high-priority launch adds an estimate and a few atomics on the priority file; a
//! best-effort one may wait (see `priority`).

pub(crate) mod bucket;
pub(crate) mod burst;
pub(crate) mod clock;
pub(crate) mod engine;
pub(crate) mod estimate;
pub(crate) mod priority;
pub(crate) mod probe;
pub(crate) mod sampler;
pub(crate) mod stream;
pub(crate) mod util;

use crate::devices::{Dev, Devices, MAX_ORDINALS};
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::{CUdevice, CUresult};
use crate::locks::{hold_all, release_all};
use crate::log::{log, Level};
use crate::time::monotonic_ns;
use clock::Monotonic;
use cuquota_core::region::PriorityEntry;
use cuquota_core::{DeviceId, Policy, Priority};
use engine::{Engine, Gpu, Poll, Shared, Ticket};
use estimate::launch_key;
use priority::{Completions, Gate, Priorities, Tracker};
use probe::{EventApi, EventProbes};
use sampler::Sampler;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use stream::StreamDevices;
use util::Util;

/// The process's throttle: estimates and probe bookkeeping per device, CUDA event probes, NVML utilisation.
pub(crate) struct SmThrottle {
    devices: Arc<Devices>,
    engine: Engine,
    probes: Option<EventProbes>,
    util: Util,
    prio: Priorities,
    done: Completions,
    streams: StreamDevices,
    /// The NVML sampler thread (`sampler`).
    sampler: Sampler,
    /// The primary context's handle per ordinal, learnt at its retain (0 = not seen): a release or reset of
    /// the primary context ends only the probes whose events live in it.
    primary: [AtomicUsize; MAX_ORDINALS],
}

/// The driver as the engine sees it during one launch: event probes and other containers' utilisation.
struct Driver<'a> {
    probes: Option<&'a EventProbes>,
    util: &'a Util,
    nvml: &'a Nvml,
    devices: &'a Devices,
}

impl Gpu for Driver<'_> {
    fn probe_begin(&self, dev: usize, stream: usize) -> u64 {
        self.probes.map_or(0, |p| p.probe_begin(dev, stream))
    }
    fn probe_end(&self, p: u64, stream: usize) -> bool {
        self.probes.is_some_and(|pr| pr.probe_end(p, stream))
    }
    fn probe_poll(&self, p: u64) -> Poll {
        self.probes.map_or(Poll::Failed, |pr| pr.probe_poll(p))
    }
    fn probe_release(&self, _p: u64) {}
    fn probe_started(&self, p: u64) -> Option<bool> {
        self.probes.and_then(|pr| pr.probe_started(p))
    }
    fn device_use(&self, dev: usize) -> Option<burst::DeviceUse> {
        self.util.device_use(self.nvml, self.devices, dev)
    }
    fn measures(&self, dev: usize, now: u64) -> bool {
        self.probes.is_some_and(|p| p.usable(dev, now))
    }
    fn own_busy_ns(&self, dev: usize) -> Option<u64> {
        self.util.own_busy_ns(self.nvml, self.devices, dev)
    }
    fn occupancy(&self, dev: usize) -> Option<util::Occupancy> {
        self.util.occupancy(self.nvml, self.devices, dev)
    }
}

/// A best-effort launch for [`priority::Completions::track`]: its estimate, whether that was measured, and when
/// it was made.
type BeLaunch = (u64, bool, u64);

impl SmThrottle {
    /// The throttle of the devices in `devices`, measuring with `cuda`'s events when it has them.
    pub(crate) fn new(devices: Arc<Devices>, cuda: &CudaTable) -> SmThrottle {
        let c = cuda;
        let api = (|| {
            Some(EventApi {
                cuEventCreate: c.cuEventCreate?,
                cuEventDestroy: c.cuEventDestroy_v2?,
                cuEventRecord: c.cuEventRecord?,
                cuEventQuery: c.cuEventQuery?,
                cuEventSynchronize: c.cuEventSynchronize?,
                cuEventElapsedTime: c.cuEventElapsedTime_v2.or(c.cuEventElapsedTime)?,
                cuStreamGetCtx: c.cuStreamGetCtx?,
                cuCtxGetCurrent: c.cuCtxGetCurrent?,
                cuCtxPushCurrent: c.cuCtxPushCurrent_v2?,
                cuCtxPopCurrent: c.cuCtxPopCurrent_v2?,
            })
        })();
        let probes = api.map(EventProbes::new);
        if probes.is_none() && c.loaded && devices.sm_limited() {
            log!(
                Level::Warn,
                "CUDA events unavailable: SM limits calibrate launch costs from NVML utilisation"
            );
        }
        SmThrottle {
            devices,
            engine: Engine::new(),
            probes,
            util: Util::default(),
            prio: Priorities::default(),
            done: Completions::new(api),
            streams: StreamDevices::default(),
            sampler: Sampler::default(),
            primary: [const { AtomicUsize::new(0) }; MAX_ORDINALS],
        }
    }

    /// Ordinal `ord`'s primary context is `ctx` (from its retain).
    pub(crate) fn primary_is(&self, ord: CUdevice, ctx: usize) {
        if let Some(p) = usize::try_from(ord).ok().and_then(|o| self.primary.get(o)) {
            p.store(ctx, Ordering::Relaxed);
        }
    }

    /// The work behind launch key `key` changed (an updated graph exec): measured again before it is trusted.
    pub(crate) fn work_changed(&self, key: u64) {
        self.engine.unmeasure(key);
    }

    /// Could any launch be throttled or held for priority right now? (The no-limit fast path.)
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.devices.launch_limited()
    }

    fn driver<'a>(&'a self, nvml: &'a Nvml) -> Driver<'a> {
        Driver {
            probes: self.probes.as_ref(),
            util: &self.util,
            nvml,
            devices: &self.devices,
        }
    }

    /// Sizes the work released after a throttle wait to this time slice (µs; 0 = not shaped).
    pub(crate) fn set_time_slice_us(&self, us: u32) {
        self.engine.set_time_slice_us(us);
    }

    /// Throttles one launch on its stream's device: admit (maybe sleeping), measure a sample, call. `stream`: the
    /// stream the launch uses (the NULL stream already resolved to the legacy or per-thread one); `launch` makes
    /// the real call.
    pub(crate) fn launch(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        key: u64,
        stream: usize,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.enqueue(cuda, nvml, key, stream, true, launch)
    }

    /// A copy or memset (`key`: its size class) on `stream`: judged by priority as a launch is (a high-priority
    /// one raises the queue estimate, a best-effort one is gated within the budget), measured like a kernel,
    /// but never charged to the SM limit (copy engines are not SMs; HAMi does not count them either).
    pub(crate) fn copy(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        key: u64,
        stream: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.enqueue(cuda, nvml, key, stream, false, call)
    }

    /// [`SmThrottle::launch`], or with `sm` false [`SmThrottle::copy`].
    fn enqueue(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        key: u64,
        stream: usize,
        sm: bool,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Some(dev) = self.charged(cuda, self.target(cuda, stream)) else {
            return launch();
        };
        let lim = self.devices.policy(dev);
        let prio = self.devices.priority_role(dev, lim.priority);
        let throttles = sm && lim.throttles();
        if !throttles && prio.is_none() {
            return launch();
        }
        let gpu = self.driver(nvml);
        let sh = self.shared(dev.id);
        let idx = dev.id.index();
        let ticket = if throttles {
            self.admit(&gpu, dev, lim, key, &sh)
        } else {
            None
        };
        match prio {
            Some((Priority::High, e)) => {
                // Estimated and measured even without an SM limit: best-effort tenants wait for its queue.
                let now = monotonic_ns();
                let t = ticket.unwrap_or_else(|| self.engine.observe(idx, &sh, key, now, &gpu));
                self.prio.hp_launch(e, idx, now, t.charged);
                self.run(&gpu, &sh, t, stream, launch)
            }
            Some((Priority::Low, e)) => {
                // Estimated (as high-priority launches are) for the budget of queued best-effort time; judged
                // last, after the SM limit's wait: the high-priority queue is judged when the kernel goes.
                let t = ticket.unwrap_or_else(|| self.engine.observe(idx, &sh, key, monotonic_ns(), &gpu));
                let sure = self.engine.measured(t.key);
                let est = priority::be_estimate(t.charged, sure);
                let gate = self
                    .prio
                    .be_admit(e, idx, stream, est, sure, &Monotonic, &self.done);
                let at = monotonic_ns();
                let r = self.run(&gpu, &sh, t, stream, launch);
                self.be_after(e, idx, gate, stream, (est, sure, at), r.ok());
                r
            }
            None => match ticket {
                Some(t) => self.run(&gpu, &sh, t, stream, launch),
                None => launch(),
            },
        }
    }

    /// After a best-effort launch under the token (`est`: its estimate, whether measured, and when it was
    /// made): track its completion (the token comes back when all of this process's tracked kernels are done),
    /// or give the token back at once when the launch failed and nothing else of ours is queued.
    fn be_after(
        &self,
        e: PriorityEntry<'_>,
        idx: usize,
        gate: Gate,
        stream: usize,
        (est, sure, at): BeLaunch,
        ok: bool,
    ) {
        let Gate::Token { value, waited_ns } = gate else {
            return;
        };
        if ok {
            e.count_be_launch(waited_ns);
            if !self.done.track(idx, stream, est, sure, at) {
                log!(
                    Level::Debug,
                    "best-effort launch not tracked: waiting for it as estimated"
                );
                self.done.untracked(idx, est);
            }
        } else if self.done.reap(idx, monotonic_ns()).n == 0 {
            e.release_token(value);
            self.done.set_token(idx, None);
        }
    }

    /// The ordinal a launch on `stream` runs on (`None`: the driver cannot say). A process that sees one device
    /// asks nothing.
    #[inline]
    fn target(&self, cuda: &CudaTable, stream: usize) -> Option<CUdevice> {
        if self.devices.single_device(cuda) {
            return Some(0);
        }
        self.streams.device_of(cuda, stream)
    }

    /// The device a launch on ordinal `ord` is charged to. A device that cannot be told or accounted is charged
    /// as the strictest of the process's devices: never not at all.
    #[inline]
    fn charged(&self, cuda: &CudaTable, ord: Option<CUdevice>) -> Option<Dev> {
        ord.and_then(|o| self.devices.device(cuda, o))
            .or_else(|| self.strictest())
    }

    /// The known device with the lowest SM share (a hard limit before a burst one at the same share).
    #[cold]
    fn strictest(&self) -> Option<Dev> {
        self.devices
            .known()
            .map(|(dev, _)| (dev, self.devices.policy(dev)))
            .filter(|(_, lim)| lim.throttles())
            .min_by_key(|(_, lim)| (lim.sm_share(), lim.is_burst()))
            .map(|(dev, _)| dev)
    }

    /// A context was destroyed or a primary context released: its address may come back as another device's.
    pub(crate) fn contexts_changed(&self) {
        self.streams.contexts_changed();
    }

    /// Context `ctx` (or, `None`, the primary context of ordinal `ord`) is about to end: a probe whose events
    /// were recorded there is polled a last time and otherwise settled by [`SmThrottle::context_ended`]. Returns the
    /// usage devices concerned (for `context_ended`). Nothing to do without a probe out.
    /// `poll`: false when the context may already be gone (its events are then not touched at all).
    pub(crate) fn context_ending(
        &self,
        nvml: &Nvml,
        ctx: Option<usize>,
        ord: CUdevice,
        poll: bool,
    ) -> Vec<usize> {
        let Some(probes) = self.probes.as_ref() else {
            return Vec::new();
        };
        // The primary context of `ord`: only probes recorded in it end. Its handle is learnt at its retain (the
        // only way a program, or the runtime, gets it); one never retained through us holds no probe.
        let Some(ctx) = ctx.or_else(|| {
            let p = self
                .primary
                .get(usize::try_from(ord).ok()?)?
                .load(Ordering::Relaxed);
            (p != 0).then_some(p)
        }) else {
            return Vec::new();
        };
        let devs = probes.forget_context(ctx);
        let gpu = self.driver(nvml);
        let now = monotonic_ns();
        for &i in &devs {
            if let Some((d, _)) = self.devices.known().find(|(d, _)| d.id.index() == i) {
                self.engine.context_ending(i, &self.shared(d.id), now, &gpu, poll);
            }
            probes.forget(i);
        }
        devs
    }

    /// The context is gone: charge its probes that were still out up to now.
    pub(crate) fn context_ended(&self, devs: &[usize]) {
        let now = monotonic_ns();
        for &i in devs {
            if let Some((d, _)) = self.devices.known().find(|(d, _)| d.id.index() == i) {
                self.engine.context_ended(i, &self.shared(d.id), now);
            }
        }
    }

    /// A synchronize returned: the work it waited for is done, so a probe out on its device is polled now
    /// (charged at its measurement) rather than by a later launch that a short-lived process never makes.
    pub(crate) fn synchronized(&self, nvml: &Nvml) {
        if !self.active() {
            return;
        }
        let gpu = self.driver(nvml);
        for (d, _) in self.devices.known() {
            let i = d.id.index();
            if self.engine.probe_out(i) {
                self.engine.poll(i, &self.shared(d.id), monotonic_ns(), &gpu);
            }
            let lim = self.devices.policy(d);
            if lim.throttles() {
                let sh = self.shared(d.id);
                let rate = engine::effective_rate(lim, sh.words);
                self.engine.sync_window(i, &sh, monotonic_ns(), rate, &gpu);
            }
        }
    }

    /// The NVML sampler thread's state.
    pub(crate) fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// One tick of the NVML sampler (`Engine::sample_tick`) on every SM-limited device. False when no device
    /// has an SM limit (the thread then ends).
    pub(crate) fn sample(&self, nvml: &Nvml) -> bool {
        let gpu = self.driver(nvml);
        let mut limited = false;
        for (d, _) in self.devices.known() {
            let lim = self.devices.policy(d);
            if !lim.throttles() {
                continue;
            }
            limited = true;
            let sh = self.shared(d.id);
            let rate = engine::effective_rate(lim, sh.words);
            self.engine
                .sample_tick(d.id.index(), &sh, monotonic_ns(), rate, &gpu);
        }
        limited
    }

    /// The process exits: each device's probe is settled and its debt paid (see `Engine::exit`).
    pub(crate) fn at_exit(&self) {
        for (d, _) in self.devices.known() {
            let i = d.id.index();
            if !self.engine.probe_out(i) && self.engine.owed(i) == 0 {
                continue;
            }
            let sh = self.shared(d.id);
            let lim = self.devices.policy(d);
            let rate = if lim.throttles() {
                engine::effective_rate(lim, sh.words)
            } else {
                0
            };
            self.engine.exit(i, &sh, monotonic_ns(), rate);
        }
    }

    /// Takes the launch's tokens on `dev` (maybe sleeping; the limit is re-read after every sleep).
    fn admit(&self, gpu: &Driver<'_>, dev: Dev, lim: Policy, key: u64, sh: &Shared<'_>) -> Option<Ticket> {
        let mut first = Some(lim);
        let limit = || first.take().unwrap_or_else(|| self.devices.policy(dev));
        self.engine.admit(dev.id.index(), sh, limit, key, &Monotonic, gpu)
    }

    fn shared(&self, id: DeviceId) -> Shared<'_> {
        let usage = self.devices.usage();
        let slot = usage.cached_slot().or_else(|| usage.process_slot().ok());
        Shared {
            words: usage.throttle(id),
            busy_ns: usage.busy_ns(id),
            gpu_ns: slot.map(|sl| usage.gpu_ns(sl, id)),
            throttled_ns: usage.throttled_ns(id),
        }
    }

    /// Starts the probe a ticket asked for (0 = none): a failed start gives the claim back.
    fn begin(&self, gpu: &Driver<'_>, t: &Ticket, stream: usize) -> u64 {
        if !t.probe {
            return 0;
        }
        let h = gpu.probe_begin(t.dev, stream);
        if h == 0 {
            self.engine.probe_abandon(t.dev);
        }
        h
    }

    /// After the launch (made at `at`): a failed one is refunded, a probed one's end event recorded.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        gpu: &Driver<'_>,
        sh: &Shared<'_>,
        t: &Ticket,
        h: u64,
        stream: usize,
        ok: bool,
        at: u64,
    ) {
        if !ok {
            if h != 0 {
                self.engine.probe_abandon(t.dev);
            }
            self.engine.refund(sh, &Ticket { probe: false, ..*t });
        } else if h != 0 {
            if gpu.probe_end(h, stream) {
                self.engine.probe_issued(t, h, at);
                // Here, not on every launch: a probe is at most one launch in `PROBE_INTERVAL_NS`.
                self.engine.set_sampled(self.sampler.ensure());
            } else {
                self.engine.probe_abandon(t.dev);
            }
        }
    }

    fn run(
        &self,
        gpu: &Driver<'_>,
        sh: &Shared<'_>,
        t: Ticket,
        stream: usize,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let at = if t.probe { monotonic_ns() } else { 0 };
        let h = self.begin(gpu, &t, stream);
        let r = launch();
        self.finish(gpu, sh, &t, h, stream, r.ok(), at);
        r
    }

    /// The CUDA ordinal a stream's work runs on (its context's device); `None` when the driver cannot say.
    pub(crate) fn stream_device(&self, cuda: &CudaTable, stream: usize) -> Option<CUdevice> {
        self.target(cuda, stream)
    }

    /// Multi-device launch: admit on every device first (in order), then launch once. `parts`: (ordinal, key,
    /// probe stream) per device; an ordinal the driver could not tell is charged as the strictest device.
    pub(crate) fn launch_multi(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        parts: &[(Option<CUdevice>, u64, usize)],
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let gpu = self.driver(nvml);
        let mut admitted: Vec<(Shared<'_>, Ticket, usize, u64)> = Vec::with_capacity(parts.len());
        // Best-effort parts gated by priority, as single launches are (each device's gate in turn).
        let mut gated: Vec<(PriorityEntry<'_>, usize, Gate, usize, BeLaunch)> = Vec::new();
        for &(ord, key, stream) in parts {
            let Some(dev) = self.charged(cuda, ord) else {
                continue;
            };
            let lim = self.devices.policy(dev);
            let prio = self.devices.priority_role(dev, lim.priority);
            if !lim.throttles() && prio.is_none() {
                continue;
            }
            let sh = self.shared(dev.id);
            let idx = dev.id.index();
            let ticket = if lim.throttles() {
                self.admit(&gpu, dev, lim, key, &sh)
            } else {
                None
            };
            let estimated = |t: Option<Ticket>| {
                t.unwrap_or_else(|| self.engine.observe(idx, &sh, key, monotonic_ns(), &gpu))
            };
            match prio {
                Some((Priority::High, e)) => {
                    let t = estimated(ticket);
                    self.prio.hp_launch(e, idx, monotonic_ns(), t.charged);
                    admitted.push((sh, t, stream, 0));
                }
                Some((Priority::Low, e)) => {
                    let t = estimated(ticket);
                    let sure = self.engine.measured(t.key);
                    let est = priority::be_estimate(t.charged, sure);
                    let gate = self
                        .prio
                        .be_admit(e, idx, stream, est, sure, &Monotonic, &self.done);
                    gated.push((e, idx, gate, stream, (est, sure, monotonic_ns())));
                    admitted.push((sh, t, stream, 0));
                }
                None => admitted.extend(ticket.map(|t| (sh, t, stream, 0))),
            }
        }
        let at = monotonic_ns();
        for (_, t, stream, h) in admitted.iter_mut() {
            *h = self.begin(&gpu, t, *stream);
        }
        let r = launch();
        for (sh, t, stream, h) in &admitted {
            self.finish(&gpu, sh, t, *h, *stream, r.ok(), at);
        }
        for (e, idx, gate, stream, est) in gated {
            self.be_after(e, idx, gate, stream, est, r.ok());
        }
        r
    }

    /// Takes the engine's outstanding-probe locks, then the probe slots', then the best-effort tracking slots'
    /// (see `state`'s fork handlers for the order).
    pub(crate) fn fork_prepare(&self) {
        hold_all(self.engine.locks());
        hold_all(self.probes.iter().flat_map(|p| p.locks()));
        hold_all(self.done.locks());
    }

    /// Undoes [`SmThrottle::fork_prepare`].
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(crate) unsafe fn fork_release(&self, side: crate::locks::Side) {
        // SAFETY: the caller's contract.
        unsafe {
            release_all(self.done.locks(), side);
            release_all(self.probes.iter().flat_map(|p| p.locks()), side);
            release_all(self.engine.locks(), side);
        }
        if matches!(side, crate::locks::Side::Child) {
            // The parent's probes, events and debts: it settles and pays them; here they are not ours.
            self.engine.forget_probes();
            self.util.forget_in_child();
            self.sampler.forget_in_child();
            if let Some(p) = &self.probes {
                p.forget_all();
            }
        }
    }
}

/// Key of a kernel launch (function, grid, block).
#[inline]
pub(crate) fn kernel_key(f: *mut c_void, grid: [u32; 3], block: [u32; 3]) -> u64 {
    let g = grid.iter().map(|&x| x as u64).product::<u64>();
    let b = block.iter().map(|&x| x as u64).product::<u64>();
    launch_key(f as usize, g, b)
}

#[cfg(test)]
mod tests {
    use cuquota_core::{Policy, PolicyKind};

    #[test]
    fn active_only_between_1_and_99() {
        for (pct, want) in [
            (0, false),
            (1, true),
            (50, true),
            (99, true),
            (100, false),
            (250, false),
        ] {
            assert_eq!(
                Policy {
                    sm: Some(pct),
                    kind: PolicyKind::Hard,
                    weight: Some(100),
                    ..Policy::NONE
                }
                .throttles(),
                want,
                "{pct}"
            );
        }
        assert!(!Policy {
            sm: Some(50),
            kind: PolicyKind::Disabled,
            weight: Some(100),
            ..Policy::NONE
        }
        .throttles());
    }

    mod stream_target {
        use super::super::SmThrottle;
        use crate::devices::Devices;
        use crate::driver::cuda::CudaTable;
        use crate::driver::nvml::Nvml;
        use crate::ffi::cuda::*;
        use cuquota_core::{Config, Policy, PolicyKind, UsageRegion};
        use std::collections::BTreeMap;
        use std::sync::Arc;

        // Two fake devices; stream 0x1000 + d is on device d, any other stream is one the driver cannot place.
        unsafe extern "C" fn count(n: *mut std::ffi::c_int) -> CUresult {
            // SAFETY: test out-pointer.
            unsafe { *n = 2 };
            CUresult::SUCCESS
        }
        unsafe extern "C" fn uuid(u: *mut CUuuid, d: CUdevice) -> CUresult {
            // SAFETY: test out-pointer.
            unsafe { (*u).bytes = [d as u8 + 1; 16] };
            CUresult::SUCCESS
        }
        unsafe extern "C" fn stream_device(s: CUstream, d: *mut CUdevice) -> CUresult {
            match s as usize {
                0x1000 | 0x1001 => {
                    // SAFETY: test out-pointer.
                    unsafe { *d = (s as usize - 0x1000) as CUdevice };
                    CUresult::SUCCESS
                }
                _ => CUresult::ERROR_INVALID_HANDLE,
            }
        }

        #[test]
        fn a_launch_is_charged_to_its_streams_device_or_the_strictest() {
            let path =
                std::env::temp_dir().join(format!("cuquota-unit-{}-stream-target", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let mut cfg = Config::default();
            let hard30 = Policy {
                sm: Some(30),
                kind: PolicyKind::Hard,
                ..Policy::NONE
            };
            cfg.devices = BTreeMap::from([(1, hard30)]);
            let devices = Arc::new(Devices::new(
                cfg,
                UsageRegion::open(&path).unwrap(),
                Vec::new(),
                None,
            ));
            let mut cuda = CudaTable::empty(true);
            cuda.cuDeviceGetCount = Some(count);
            cuda.cuDeviceGetUuid_v2 = Some(uuid);
            cuda.cuStreamGetDevice = Some(stream_device);
            let ids: Vec<_> = (0..2).map(|o| devices.device(&cuda, o).unwrap().id).collect();
            let t = SmThrottle::new(devices.clone(), &cuda);
            let nvml = Nvml::new(None);
            let busy = |d: usize| {
                devices
                    .usage()
                    .busy_ns(ids[d])
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            let launch = |stream: usize| t.launch(&cuda, &nvml, 7, stream, || CUresult::SUCCESS);
            assert_eq!(launch(0x1000), CUresult::SUCCESS);
            assert_eq!((busy(0), busy(1)), (0, 0), "device 0 has no limit");
            launch(0x1001);
            let one = busy(1);
            assert!(one > 0, "device 1's launch is charged there");
            // A stream the driver cannot place: charged as the strictest device (1), never not at all.
            launch(0x4242);
            assert!(busy(1) > one, "an unknown stream's launch went uncharged");
            assert_eq!(busy(0), 0);
            let _ = std::fs::remove_file(&path);
        }
    }
}
