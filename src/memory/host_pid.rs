//! The pid NVML knows this process by.
//!
//! In a separate pid namespace (a Kubernetes pod) NVML lists host pids, not ours. When our own pid is not in
//! its list, the host pid is learned by diffing NVML's process list around this process's first context
//! creation on a device: we are the one new pid that is not already a member of the container. It is then
//! what overhead measurement looks for in NVML's lists, and it is recorded in our usage slot so the NVML filter
//! and the burst controller recognise us. An ambiguous diff (several processes creating contexts at the same
//! moment) is narrowed at later context creations and module loads.

use super::driver::Processes;
use crate::devices::Devices;
use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::{CUdevice, CUresult};
use crate::locks::Lock;
use crate::log::{log, Level};
use cuquota_core::region::SlotState;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Touched only on context creation and module load, and only while the pid is unknown. What it learns is
/// recorded through its own `Devices` (the usage slot, HAMi's file, the throttle's proof).
pub(crate) struct HostPid {
    devices: Arc<Devices>,
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
    pub(super) candidates: Lock<Option<(CUdevice, Vec<u32>)>>,
    /// Ordinal + 1 of the device whose diff proved `Devices::host_pid` (0 = none).
    proof_dev: AtomicU32,
}

impl HostPid {
    pub(super) fn new(devices: Arc<Devices>) -> HostPid {
        HostPid {
            devices,
            pid: AtomicU32::new(0),
            touched: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            candidates: Lock::new(None),
            proof_dev: AtomicU32::new(0),
        }
    }

    /// The learned host pid, if any (one atomic load).
    pub(crate) fn get(&self) -> Option<u32> {
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

    /// A forked child is another process: NVML knows it by another pid, to be learned again.
    pub(super) fn reset(&self) {
        self.pid.store(0, Ordering::Relaxed);
        self.touched.store(0, Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
        *self.candidates.lock() = None;
        self.proof_dev.store(0, Ordering::Relaxed);
    }
}

/// The one pid among `after` that is new since `before` and not already a member of the container (a host
/// pid another process of ours recorded). `Err` with the new non-member pids when there is not exactly one
/// (none, or several processes started contexts at the same moment).
pub(crate) fn new_host_pid(before: &[u32], after: &[u32], members: &[u32]) -> Result<u32, Vec<u32>> {
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

/// The pid a diff proves is ours, for the throttle: the diff alone singles out one new pid. No member's slot
/// (a tenant writes them) is consulted, nor our own pid (in a pid namespace it may be another's host pid).
/// No proof when this process already had a context on the device that no hook saw (`unseen`: e.g. one
/// `cuGreenCtxCreate` made: not hooked, it retains the primary context, cuda.h): NVML may list us in `before`
/// already, and a sibling's context created in the window would then be the one new pid.
fn proven_pid(before: &[u32], after: &[u32], unseen: bool) -> Option<u32> {
    if unseen {
        return None;
    }
    new_host_pid(before, after, &[]).ok()
}

/// Whether a proof of `pid` stands once this process's last context on the device is gone and NVML lists
/// `listed` there (`None`: NVML cannot tell): only if NVML no longer lists it. Still listed, it was not ours
/// (a sibling's, taken in the diff's window) or a context no hook saw keeps us there.
fn proof_stands(pid: u32, listed: Option<&[u32]>) -> bool {
    listed.is_some_and(|l| !l.contains(&pid))
}

/// Whether the device's primary context is already active before this process's first hooked context creation
/// on it: only a creation no hook saw can have made it so. An error is read as yes (no proof).
fn unseen_context(cuda: &CudaTable, dev: CUdevice) -> bool {
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers; a missing function answers CUDA_ERROR_NOT_FOUND.
    let r = unsafe { cuda.cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
    !r.ok() || active != 0
}

impl HostPid {
    /// The pids NVML lists on the device of `ordinal`.
    fn nvml_pids(&self, nvml: &dyn Processes, ordinal: CUdevice) -> Option<Vec<u32>> {
        let uuid = self.devices.uuid_of(ordinal)?;
        let list = nvml.processes(&uuid)?;
        Some(list.iter().map(|p| p.pid).collect())
    }

    /// Host pids other live processes of the container recorded in their usage slots.
    fn member_host_pids(&self) -> Vec<u32> {
        self.devices
            .usage()
            .processes()
            .into_iter()
            .filter(|p| p.state == SlotState::Live && p.host_pid != 0)
            .map(|p| p.host_pid)
            .collect()
    }

    /// Records our host pid: in the process state and in our usage slot (claimed if needed).
    fn learned(&self, pid: u32) {
        self.pid.store(pid, Ordering::Release);
        *self.candidates.lock() = None;
        self.devices.hami_host_pid(pid);
        let usage = self.devices.usage();
        match usage.process_slot() {
            Ok(slot) => usage.set_host_pid(slot, pid),
            Err(e) => log!(Level::Warn, "host pid {pid} not recorded: no usage slot ({e})"),
        }
    }

    /// NVML listed us as `pid` (found by our own pid, or by the host pid learned earlier).
    pub(super) fn listed_as(&self, pid: u32) {
        if pid == std::process::id() && self.get().is_none() {
            self.learned(pid);
        } else if let Some(slot) = self.devices.usage().cached_slot() {
            self.devices.usage().set_host_pid(slot, pid);
            self.devices.hami_host_pid(pid);
        }
    }

    /// This process's last hooked context on `dev` is gone: a proof made there that NVML still lists is
    /// withdrawn (no correction from then on).
    pub(super) fn last_context_gone(&self, nvml: &dyn Processes, dev: CUdevice) {
        let Some(p) = self.devices.host_pid() else {
            return;
        };
        if self.proof_dev.load(Ordering::Relaxed) != dev as u32 + 1 {
            return;
        }
        if !proof_stands(p, self.nvml_pids(nvml, dev).as_deref()) {
            log!(
                Level::Warn,
                "device {dev}: pid {p} still listed after our last context: not ours"
            );
            self.proof_dev.store(0, Ordering::Relaxed);
            self.devices.host_pid_proven(0);
        }
    }

    /// Runs a context-creating driver call on `ordinal`, learning our host pid around it when needed (`live`:
    /// whether this process holds a live context on an ordinal, for a retry of an ambiguous diff).
    pub(super) fn creating_context(
        &self,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ordinal: CUdevice,
        live: impl Fn(CUdevice) -> bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let before = self
            .before(nvml, ordinal, live)
            .map(|b| (b, unseen_context(cuda, ordinal)));
        let r = call();
        self.after(nvml, ordinal, before, r.ok());
        r
    }

    /// Before a context creation on `dev`: when our host pid is unknown and this is our first context creation
    /// on the device, NVML's pids on it (the diff's "before"). Otherwise retries an earlier ambiguous diff.
    fn before(
        &self,
        nvml: &dyn Processes,
        dev: CUdevice,
        live: impl Fn(CUdevice) -> bool,
    ) -> Option<Vec<u32>> {
        if self.get().is_some() {
            return None;
        }
        let bit = 1u64.checked_shl(u32::try_from(dev).ok()?)?;
        if self.touched.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            self.retry(nvml, live);
            return None;
        }
        if !self.try_begin() {
            return None;
        }
        match self.nvml_pids(nvml, dev) {
            Some(b) if !b.contains(&std::process::id()) => Some(b),
            _ => {
                self.end();
                None
            }
        }
    }

    /// After the context creation that [`HostPid::before`] prepared (`before` is `Some`): diffs NVML's list.
    fn after(&self, nvml: &dyn Processes, dev: CUdevice, before: Option<(Vec<u32>, bool)>, created: bool) {
        let Some((before, unseen)) = before else {
            return;
        };
        if created {
            if let Some(after) = self.nvml_pids(nvml, dev) {
                if let Some(p) = proven_pid(&before, &after, unseen) {
                    self.proof_dev.store(dev as u32 + 1, Ordering::Relaxed);
                    self.devices.host_pid_proven(p);
                }
                if after.contains(&std::process::id()) {
                    self.learned(std::process::id());
                } else {
                    match new_host_pid(&before, &after, &self.member_host_pids()) {
                        Ok(p) => {
                            log!(Level::Debug, "device {dev}: NVML knows this process as pid {p}");
                            self.learned(p);
                        }
                        Err(new) => {
                            log!(
                                Level::Debug,
                                "device {dev}: host pid ambiguous (new NVML pids {new:?}); retried later"
                            );
                            if new.len() >= 2 {
                                *self.candidates.lock() = Some((dev, new));
                            }
                        }
                    }
                }
            }
        }
        self.end();
    }

    /// Retries an ambiguous diff: of its new pids, those NVML still lists on that device and that no other
    /// process of the container has recorded; exactly one left → that is us. Needs a live context of ours on
    /// the device (so that we are still listed there: `live`).
    pub(super) fn retry(&self, nvml: &dyn Processes, live: impl Fn(CUdevice) -> bool) {
        if self.get().is_some() || !self.try_begin() {
            return;
        }
        let pending = self.candidates.lock().clone();
        if let Some((dev, cands)) = pending {
            if live(dev) {
                if let Some(now) = self.nvml_pids(nvml, dev) {
                    let still: Vec<u32> = cands.into_iter().filter(|p| now.contains(p)).collect();
                    match new_host_pid(&[], &still, &self.member_host_pids()) {
                        Ok(p) => {
                            log!(
                                Level::Debug,
                                "device {dev}: NVML knows this process as pid {p} (retry)"
                            );
                            self.learned(p);
                        }
                        Err(left) => {
                            log!(Level::Debug, "device {dev}: host pid still ambiguous ({left:?})");
                            *self.candidates.lock() = (left.len() >= 2).then_some((dev, left));
                        }
                    }
                }
            }
        }
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::{new_host_pid, proof_stands, proven_pid};

    #[test]
    fn a_proof_still_listed_after_our_last_context_is_withdrawn() {
        // The control: our contexts gone, NVML no longer lists the proven pid.
        assert!(proof_stands(100_007, Some(&[5])));
        // A sibling's pid (taken in the diff's window) outlives our contexts; NVML unable to tell.
        assert!(!proof_stands(100_008, Some(&[5, 100_008])));
        assert!(!proof_stands(100_007, None));
    }

    #[test]
    fn a_pid_listed_before_the_first_hooked_creation_proves_nothing() {
        // An unhooked creation (cuGreenCtxCreate) got us, H, listed already; sibling C creates its context in
        // the window. The diff alone names C (the control: what the proof took before)...
        let (h, c) = (100_007, 100_008);
        assert_eq!(proven_pid(&[5, h], &[5, h, c], false), Some(c));
        // ...so with an unseen context there is no proof.
        assert_eq!(proven_pid(&[5, h], &[5, h, c], true), None);
        assert_eq!(proven_pid(&[5], &[5, h], true), None);
    }

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
