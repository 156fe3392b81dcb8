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
use super::{Memory, OverCap};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::log::{log, Level};
use std::sync::atomic::Ordering;

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

impl Memory {
    /// What `cuMemGetInfo` of `dev` capped at `cap` reports used: the container's charge, which near the cap is
    /// first reconciled with the driver's figure (the ledger alone is not trusted there). This
    /// process's pools on `dev` are re-read first.
    #[inline(always)]
    pub(super) fn info_used(&self, cuda: &CudaTable, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        self.refresh_pools_of(cuda, dev.id);
        let (used, held) = self.usage().container_used_held(dev.id);
        if near_cap(cap, used) {
            return self.info_used_slow(nvml, dev, cap);
        }
        held
    }

    #[cold]
    #[inline(never)]
    fn info_used_slow(&self, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        if self.near_cap_without_credit(dev, cap) {
            let _ = self.reconcile(nvml, dev, cap, 0);
        }
        self.container_held(dev)
    }

    /// Whether the container is near `cap` on `dev` by what its processes hold: credit others charged ahead
    /// (idle processes' included) is taken back first, so it never makes anyone ask the driver.
    fn near_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        let (used, held) = self.usage().container_used_held(dev.id);
        if used != held {
            self.usage().drain_all_credit(dev.id);
        }
        near_cap(cap, self.container_used(dev))
    }

    /// An admission of `bytes` on `dev` that brought the container to `used` under `cap`: near the cap the
    /// driver's figure decides, not the ledger alone. `Err`: refused (the caller gives the charge back).
    #[inline]
    pub(super) fn near_cap_check(
        &self,
        nvml: &Nvml,
        dev: Dev,
        bytes: u64,
        cap: u64,
        used: u64,
    ) -> Result<(), OverCap> {
        if near_cap(cap, used) {
            return self.near_cap_slow(nvml, dev, bytes, cap);
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn near_cap_slow(&self, nvml: &Nvml, dev: Dev, bytes: u64, cap: u64) -> Result<(), OverCap> {
        if !self.near_cap_without_credit(dev, cap) {
            return Ok(());
        }
        // Refused: `Allocs::admit_charged` gives `bytes` back and counts the refusal.
        self.reconcile(nvml, dev, cap, bytes)
    }

    /// Reconciles this process's overhead on `dev` with NVML's figure, `pending` bytes of its ledger not yet
    /// handed out by the driver (the admission being made); then whether the container fits under `cap`.
    /// Without an NVML figure nothing is changed (the ledger is all there is).
    pub(super) fn reconcile(&self, nvml: &Nvml, dev: Dev, cap: u64, pending: u64) -> Result<(), OverCap> {
        // Near the cap the charge is exact: no credit taken from without the driver's figure.
        self.give_back_credit(dev);
        let figure = self.nvml_figure(nvml, dev);
        self.reconcile_to(nvml, dev, cap, pending, figure)
    }

    /// [`Memory::reconcile`] with NVML's figure for this process already taken.
    pub(super) fn reconcile_to(
        &self,
        nvml: &Nvml,
        dev: Dev,
        cap: u64,
        pending: u64,
        figure: Figure,
    ) -> Result<(), OverCap> {
        let lingering = self.lingering(dev); // before the overhead lock, as in `measure`
        let _g = self.overhead.lock();
        let used = match figure {
            Figure::Used(u) => u,
            Figure::NoNvml => return Ok(()),
            Figure::NotListed => return self.not_listed(dev),
        };
        let ledger = self
            .allocated(dev)
            .saturating_sub(pending)
            .saturating_add(lingering);
        // Never below what the last measurement (a context or module event) set: allocations admitted but not
        // yet made, and frees made but not yet uncharged, on other threads make the driver's figure read low for
        // an instant. Above it, each reconciliation replaces the last one's excess (so one that caught a
        // charge still being settled is corrected by the next).
        let base = self.overhead_of(dev).saturating_sub(self.first_use.excess(dev));
        let target = (used.saturating_sub(ledger) + self.overhead.inflight(dev)).max(base);
        if self.set_overhead_locked(dev, target, false).is_ok() {
            self.first_use.set_excess(dev, target - base);
        }
        let total = self.container_used(dev);
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
        match self.container_figure(nvml, dev) {
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
    pub(super) fn over_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        self.usage().drain_all_credit(dev.id);
        self.container_used(dev) > cap
    }

    /// What NVML says the container's live processes hold on `dev` (each listed process that is a member). Slow
    /// path: near the cap only.
    fn container_figure(&self, nvml: &Nvml, dev: Dev) -> Option<u64> {
        let uuid = self.devices.uuid_of(dev.ordinal)?;
        let list = nvml.processes(&uuid)?;
        let own = [std::process::id(), self.overhead.host().get().unwrap_or(0)];
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
        if !self.first_use.unlisted_said.swap(true, Ordering::Relaxed) {
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
    use super::*;

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
