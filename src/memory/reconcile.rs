//! The driver's figure is the last word on memory: this process's charge is reconciled with what NVML says it
//! holds (`usedGpuMemory`), so memory a path the hooks do not model takes is charged too.
//!
//! - **Near the cap** (an admission that would leave less than [`margin`] = max(10 % of the cap, 256 MiB)
//!   under it) the ledger is never trusted alone: the process's overhead (`used − ledger`) is re-measured
//!   first and the admission refused if the driver's figure leaves no room. Far from the cap the admission
//!   costs nothing more (the region's sum it already takes tells how near it is).
//! - **First use** (lazy loading, launch-time stack growth) is reserved before the call and settled by NVML's
//!   figure after it (`first_use`).
//!
//! Staleness bound: an unmodelled path's bytes `U` are charged at the latest by the next admission near the
//! cap (or the next `cuMemGetInfo` near the cap): while the container stays out of the margin, it holds at
//! most `cap − margin + U`, so the cap is exceeded by at most `max(0, U − margin)`; lazy loads and launch-time
//! stack growth are charged before the call that took them returns.

use super::overhead::Figure;
use super::{OverCap, PerDevice};
use crate::devices::{Dev, Devices};
use crate::driver::nvml::Nvml;
use crate::log::{log, Level};
use cuquota_core::UsageRegion;
use parking_lot::MutexGuard;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The smallest margin under the cap within which admissions reconcile first.
pub(crate) const MIN_MARGIN: u64 = 256 << 20;

/// Bytes left under `cap` below which an admission does not trust the ledger alone.
#[inline]
pub(crate) fn margin(cap: u64) -> u64 {
    (cap / 10).max(MIN_MARGIN)
}

/// Whether an admission that brought the container to `used` under `cap` is near the cap.
#[inline]
pub(crate) fn near_cap(cap: u64, used: u64) -> bool {
    cap.saturating_sub(used) < margin(cap)
}

/// What a reconciliation asks of the other families: `Memory` composes them, unit tests fake it.
pub(super) trait Others {
    /// Takes this process's credit on `dev` back (near the cap the charge is exact).
    fn credit_back(&self, dev: Dev);
    /// What NVML says this process holds on `dev`.
    fn figure(&self, nvml: &Nvml, dev: Dev) -> Figure;
    /// Bytes of allocations this process has charged on `dev`.
    fn allocated(&self, dev: Dev) -> u64;
    /// Bytes on `dev` of exports this process let go of that others still hold.
    fn lingering(&self, dev: Dev) -> u64;
    /// The overhead lock, held across a reconciliation.
    fn overhead_lock(&self) -> MutexGuard<'_, ()>;
    /// Overhead this process has charged on `dev`.
    fn overhead(&self, dev: Dev) -> u64;
    /// Overhead reserved on `dev` for calls in flight.
    fn inflight(&self, dev: Dev) -> u64;
    /// Moves the overhead charge on `dev` to `target` (the overhead lock held) and publishes it.
    fn set_overhead(&self, dev: Dev, target: u64) -> Result<(), OverCap>;
    /// This process's host pid, when known.
    fn host_pid(&self) -> Option<u32>;
}

/// Reconciliation with NVML near the cap: what the last one added to the overhead, and whether the refusal for
/// want of this process in NVML's list was said.
pub(super) struct Reconcile {
    /// The devices' identities and the usage file.
    devices: Arc<Devices>,
    /// The refusal for want of this process in NVML's list was logged.
    unlisted_said: AtomicBool,
    /// Per device entry: what the last reconciliation added to the overhead the last measurement set (the
    /// floor a reconciliation never goes below).
    excess: PerDevice,
}

impl Reconcile {
    /// Nothing reconciled yet, on `devices`.
    pub(super) fn new(devices: Arc<Devices>) -> Reconcile {
        Reconcile {
            devices,
            unlisted_said: AtomicBool::new(false),
            excess: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn usage(&self) -> &UsageRegion {
        self.devices.usage()
    }

    /// A measurement set the overhead on `dev`: no reconciliation's excess is in it.
    pub(super) fn measured(&self, dev: Dev) {
        self.excess[dev.id.index()].store(0, Ordering::Relaxed);
    }

    /// Forgets every excess (a forked child).
    pub(super) fn reset(&self) {
        for e in self.excess.iter() {
            e.store(0, Ordering::Relaxed);
        }
    }

    /// `cuMemGetInfo` near the cap (see `Memory::info_used`): what the container holds, reconciled first.
    #[cold]
    #[inline(never)]
    pub(super) fn info_used_slow(&self, acc: &dyn Others, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        if self.near_cap_without_credit(dev, cap) {
            let _ = self.reconcile(acc, nvml, dev, cap, 0);
        }
        self.usage().container_held(dev.id)
    }

    /// Whether the container is near `cap` on `dev` by what its processes hold: credit others charged ahead
    /// (idle processes' included) is taken back first, so it never makes anyone ask the driver.
    fn near_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        let (used, held) = self.usage().container_used_held(dev.id);
        if used != held {
            self.usage().drain_all_credit(dev.id);
        }
        near_cap(cap, self.usage().container_used(dev.id))
    }

    /// An admission of `bytes` on `dev` near `cap` (see `Memory::near_cap_check`): the driver's figure
    /// decides, not the ledger alone. `Err`: refused (`Allocs::admit_charged` gives `bytes` back and counts
    /// the refusal).
    #[cold]
    #[inline(never)]
    pub(super) fn near_cap_slow(
        &self,
        acc: &dyn Others,
        nvml: &Nvml,
        dev: Dev,
        bytes: u64,
        cap: u64,
    ) -> Result<(), OverCap> {
        if !self.near_cap_without_credit(dev, cap) {
            return Ok(());
        }
        self.reconcile(acc, nvml, dev, cap, bytes)
    }

    /// Reconciles this process's overhead on `dev` with NVML's figure, `pending` bytes of its ledger not yet
    /// handed out by the driver (the admission being made); then whether the container fits under `cap`.
    /// Without an NVML figure nothing is changed (the ledger is all there is).
    fn reconcile(
        &self,
        acc: &dyn Others,
        nvml: &Nvml,
        dev: Dev,
        cap: u64,
        pending: u64,
    ) -> Result<(), OverCap> {
        // Near the cap the charge is exact: no credit taken from without the driver's figure.
        acc.credit_back(dev);
        let figure = acc.figure(nvml, dev);
        self.reconcile_to(acc, nvml, dev, cap, pending, figure)
    }

    /// [`Reconcile::reconcile`] with NVML's figure for this process already taken.
    pub(super) fn reconcile_to(
        &self,
        acc: &dyn Others,
        nvml: &Nvml,
        dev: Dev,
        cap: u64,
        pending: u64,
        figure: Figure,
    ) -> Result<(), OverCap> {
        let lingering = acc.lingering(dev); // before the overhead lock, as in `measure`
        let _g = acc.overhead_lock();
        let used = match figure {
            Figure::Used(u) => u,
            Figure::NoNvml => return Ok(()),
            Figure::NotListed => return self.not_listed(dev),
        };
        let ledger = acc
            .allocated(dev)
            .saturating_sub(pending)
            .saturating_add(lingering);
        // Never below what the last measurement (a context or module event) set: allocations admitted but not
        // yet made, and frees made but not yet uncharged, on other threads make the driver's figure read low for
        // an instant. Above it, each reconciliation replaces the last one's excess (so one that caught a
        // charge still being settled is corrected by the next).
        let excess = &self.excess[dev.id.index()];
        let base = acc.overhead(dev).saturating_sub(excess.load(Ordering::Relaxed));
        let target = (used.saturating_sub(ledger) + acc.inflight(dev)).max(base);
        if acc.set_overhead(dev, target).is_ok() {
            excess.store(target - base, Ordering::Relaxed);
        }
        let total = self.usage().container_used(dev.id);
        log!(
            Level::Debug,
            "device {}: reconciled near the cap: driver says {used} bytes, overhead {target}, container {total} \
             of {cap}",
            dev.ordinal
        );
        // Over the cap: every process's credit is taken back (none of it may be spent without this check), and
        // the container counted again without it.
        if total > cap && self.over_cap_without_credit(dev, cap) {
            return Err(OverCap);
        }
        // The container's processes each reconcile only themselves: what another one holds past the shim is
        // seen here only in the driver's figure for the whole container (its live processes' `usedGpuMemory`).
        match self.container_figure(acc, nvml, dev) {
            Some(all) if all.saturating_add(pending) > cap => {
                self.usage().drain_all_credit(dev.id);
                log!(
                    Level::Debug,
                    "device {}: the driver says the container holds {all} bytes: {pending} more do not fit in {cap}",
                    dev.ordinal
                );
                Err(OverCap)
            }
            _ => Ok(()),
        }
    }

    /// Whether the container is over `cap` on `dev` once every process's credit was taken back.
    #[cold]
    fn over_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        self.usage().drain_all_credit(dev.id);
        self.usage().container_used(dev.id) > cap
    }

    /// What NVML says the container's live processes hold on `dev` (each listed process that is a member). Slow
    /// path: near the cap only.
    fn container_figure(&self, acc: &dyn Others, nvml: &Nvml, dev: Dev) -> Option<u64> {
        let uuid = self.devices.uuid_of(dev.ordinal)?;
        let list = nvml.processes(&uuid)?;
        let own = [std::process::id(), acc.host_pid().unwrap_or(0)];
        Some(
            list.iter()
                .filter(|p| self.devices.is_member(p.pid, &own))
                .map(|p| p.usedGpuMemory)
                .sum(),
        )
    }

    /// Near the cap, NVML answers but does not list this process (its host pid unknown or ambiguous): the
    /// ledger alone is not trusted there, so the admission is refused (said once per process).
    #[cold]
    fn not_listed(&self, dev: Dev) -> Result<(), OverCap> {
        if !self.unlisted_said.swap(true, Ordering::Relaxed) {
            log!(
                Level::Warn,
                "device {}: near the memory cap, and NVML does not list this process (its host pid is unknown: a \
                 pid namespace whose host pid could not be learned); allocations near the cap are refused until \
                 it is listed",
                dev.ordinal
            );
        }
        Err(OverCap)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{capped, device_under, uuid_table, TempRegion};
    use super::*;
    use parking_lot::Mutex;
    use std::cell::Cell;

    const MIB: u64 = 1 << 20;
    const CAP: u64 = 1 << 30;

    /// Reconciliation on device 0 of a fresh usage file capped at [`CAP`].
    fn fresh() -> (TempRegion, Reconcile, Dev) {
        let (t, devices, dev) = device_under("reconcile", capped(Some(CAP)), &uuid_table());
        (t, Reconcile::new(devices), dev)
    }

    /// The other families as a reconciliation sees them: the ledger, an overhead charge it moves, and NVML's
    /// figure for this process (`None`: not listed), counted when asked.
    struct Fake {
        lock: Mutex<()>,
        allocated: u64,
        overhead: Cell<u64>,
        figure: Option<u64>,
        asked: Cell<u32>,
    }

    impl Fake {
        fn new(allocated: u64, overhead: u64, figure: Option<u64>) -> Fake {
            Fake {
                lock: Mutex::new(()),
                allocated,
                overhead: Cell::new(overhead),
                figure,
                asked: Cell::new(0),
            }
        }
    }

    impl Others for Fake {
        fn credit_back(&self, _dev: Dev) {}
        fn figure(&self, _nvml: &Nvml, _dev: Dev) -> Figure {
            self.asked.set(self.asked.get() + 1);
            self.figure.map_or(Figure::NotListed, Figure::Used)
        }
        fn allocated(&self, _dev: Dev) -> u64 {
            self.allocated
        }
        fn lingering(&self, _dev: Dev) -> u64 {
            0
        }
        fn overhead_lock(&self) -> MutexGuard<'_, ()> {
            self.lock.lock()
        }
        fn overhead(&self, _dev: Dev) -> u64 {
            self.overhead.get()
        }
        fn inflight(&self, _dev: Dev) -> u64 {
            0
        }
        fn set_overhead(&self, _dev: Dev, target: u64) -> Result<(), OverCap> {
            self.overhead.set(target);
            Ok(())
        }
        fn host_pid(&self) -> Option<u32> {
            None
        }
    }

    /// Above the floor the last measurement set, a reconciliation's excess replaces the last one's (a figure
    /// that caught a charge being settled is corrected by the next), never adds to it; below it, the floor
    /// holds; a new measurement is a new floor.
    #[test]
    fn a_reconciliations_excess_replaces_the_last_ones() {
        let (_t, r, dev) = fresh();
        let nvml = Nvml::new(None);
        let reconcile = |acc: &Fake, used: u64| r.reconcile_to(acc, &nvml, dev, CAP, 0, Figure::Used(used));
        let acc = Fake::new(500 * MIB, 100 * MIB, None);
        assert_eq!(reconcile(&acc, 650 * MIB), Ok(()));
        assert_eq!(acc.overhead.get(), 150 * MIB);
        assert_eq!(reconcile(&acc, 620 * MIB), Ok(()));
        assert_eq!(acc.overhead.get(), 120 * MIB, "replaced, not 170 MiB");
        assert_eq!(reconcile(&acc, 580 * MIB), Ok(()));
        assert_eq!(acc.overhead.get(), 100 * MIB, "never below the measurement");
        assert_eq!(reconcile(&acc, 640 * MIB), Ok(()));
        assert_eq!(acc.overhead.get(), 140 * MIB);
        // A measurement set 90 MiB: the excess went with it.
        r.measured(dev);
        acc.overhead.set(90 * MIB);
        assert_eq!(reconcile(&acc, 560 * MIB), Ok(()));
        assert_eq!(acc.overhead.get(), 90 * MIB);
        // Without NVML nothing moves.
        let none = r.reconcile_to(&acc, &nvml, dev, CAP, 0, Figure::NoNvml);
        assert_eq!((none, acc.overhead.get()), (Ok(()), 90 * MIB));
    }

    /// Far from the cap NVML is not asked. Near it, a process NVML answers for but does not list is refused
    /// (the ledger alone is not trusted there), said once, and refused again; `cuMemGetInfo` near the cap
    /// reconciles first and reports what the container holds.
    #[test]
    fn a_process_nvml_does_not_list_fails_closed_near_the_cap_said_once() {
        let (_t, r, dev) = fresh();
        let nvml = Nvml::new(None);
        let usage = r.usage();
        let slot = usage.process_slot().expect("slot");
        usage.try_charge(slot, dev.id, 100 * MIB, None).expect("charged");
        let acc = Fake::new(100 * MIB, 0, None);
        assert_eq!(r.near_cap_slow(&acc, &nvml, dev, MIB, CAP), Ok(()));
        assert_eq!(acc.asked.get(), 0, "far from the cap: no driver figure");
        assert!(!r.unlisted_said.load(Ordering::Relaxed));

        usage.try_charge(slot, dev.id, 800 * MIB, None).expect("charged");
        assert_eq!(r.near_cap_slow(&acc, &nvml, dev, MIB, CAP), Err(OverCap));
        assert!(r.unlisted_said.load(Ordering::Relaxed), "said");
        assert_eq!(
            r.near_cap_slow(&acc, &nvml, dev, MIB, CAP),
            Err(OverCap),
            "still refused"
        );
        assert_eq!(acc.asked.get(), 2);
        assert_eq!(r.info_used_slow(&acc, &nvml, dev, CAP), 900 * MIB);
        assert_eq!(acc.asked.get(), 3, "reconciled first");
    }

    #[test]
    fn margin_is_a_tenth_or_256_mib() {
        const M: u64 = 1 << 20;
        assert_eq!(margin(1024 * M), 256 * M);
        assert_eq!(margin(10 * 1024 * M), 1024 * M);
        assert_eq!(margin(100 * M), 256 * M);
        assert!(!near_cap(1024 * M, 700 * M));
        assert!(near_cap(1024 * M, 800 * M));
        assert!(near_cap(1024 * M, 2048 * M));
    }
}
