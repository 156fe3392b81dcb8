//! NVML's per-process utilisation since the last sample: other containers' use of a device, for the burst
//! controller (summed over the processes that are not members of this container's usage region), and this
//! process's own device time, for degraded mode (no events to measure launches with).

use super::bucket::FULL_RATE;
use super::burst;
use crate::devices::Devices;
use crate::driver::nvml::Nvml;
use crate::ffi::nvml::{nvmlProcessUtilizationSample_t, nvmlReturn_t};
use crate::time::realtime_us;
use cuquota_core::region::layout::MAX_DEVICES;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Per usage-device entry: NVML's handle and the time of the previous sample. Atomics only, no lock.
pub(crate) struct Util {
    /// NVML handle (0 = not looked up yet, 1 = unavailable).
    handles: [AtomicUsize; MAX_DEVICES],
    /// CLOCK_REALTIME µs of the previous sample.
    last_seen: [AtomicU64; MAX_DEVICES],
    /// CLOCK_REALTIME µs of the previous own-time sample (degraded mode), 0 = none yet.
    own_seen: [AtomicU64; MAX_DEVICES],
}

impl Default for Util {
    fn default() -> Self {
        Util {
            handles: std::array::from_fn(|_| AtomicUsize::new(0)),
            last_seen: std::array::from_fn(|_| AtomicU64::new(0)),
            own_seen: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Each pid's average `smUtil` (percent) over the samples.
fn per_pid(samples: &[nvmlProcessUtilizationSample_t]) -> Vec<(u32, u64, u64)> {
    let mut per: Vec<(u32, u64, u64)> = Vec::new();
    for smp in samples {
        match per.iter_mut().find(|x| x.0 == smp.pid) {
            Some(x) => {
                x.1 += smp.smUtil as u64;
                x.2 += 1;
            }
            None => per.push((smp.pid, smp.smUtil as u64, 1)),
        }
    }
    per
}

impl Util {
    fn handle(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<*mut c_void> {
        let cached = self.handles.get(entry)?;
        let mut h = cached.load(Ordering::Relaxed);
        if h == 0 {
            h = devices
                .known()
                .find(|(d, _)| d.id.index() == entry)
                .and_then(|(_, uuid)| nvml.handle_by_uuid(&uuid))
                .map_or(1, |p| p as usize);
            cached.store(h, Ordering::Relaxed);
        }
        (h != 1).then_some(h as *mut c_void)
    }

    /// Per-mille of usage entry `entry`'s device that processes outside this container used since the previous
    /// call for it (about `burst::SAMPLE_NS`); `None` when NVML cannot tell.
    pub(crate) fn others_pm(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<u64> {
        let t = nvml.ready()?;
        let h = self.handle(nvml, devices, entry)?;
        let now = realtime_us();
        let last = self.last_seen.get(entry)?.swap(now, Ordering::Relaxed);
        let since = if last == 0 {
            now.saturating_sub(burst::SAMPLE_NS / 1000)
        } else {
            last
        };
        let mut buf = [nvmlProcessUtilizationSample_t::default(); 128];
        let mut n = buf.len() as c_uint;
        // SAFETY: a handle NVML gave us, a buffer of `n` samples, valid count pointer.
        let r = unsafe { t.nvmlDeviceGetProcessUtilization(h, buf.as_mut_ptr(), &mut n, since) };
        // NVML_ERROR_NOT_FOUND: no samples since `since` = nobody ran.
        if r == nvmlReturn_t::ERROR_NOT_FOUND {
            return Some(0);
        }
        if !r.ok() {
            return None;
        }
        // Average each pid's samples, sum over the pids outside this container.
        let per = per_pid(&buf[..(n as usize).min(buf.len())]);
        let usage = devices.usage();
        let others: u64 = per
            .iter()
            .filter(|(pid, _, _)| !usage.is_member(*pid))
            .map(|(_, sum, k)| sum * 10 / k)
            .sum();
        Some(others.min(FULL_RATE))
    }

    /// Device time (ns) this process used on usage entry `entry`'s device since the previous call, from NVML's
    /// per-process utilisation (its samples for our pid, or the host pid NVML knows us by); `None` on the first
    /// call (the baseline) or when NVML cannot tell.
    pub(crate) fn own_busy_ns(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<u64> {
        let t = nvml.ready()?;
        let h = self.handle(nvml, devices, entry)?;
        let now = realtime_us();
        let since = self.own_seen.get(entry)?.swap(now, Ordering::Relaxed);
        if since == 0 || since >= now {
            return None;
        }
        let mut buf = [nvmlProcessUtilizationSample_t::default(); 128];
        let mut n = buf.len() as c_uint;
        // SAFETY: a handle NVML gave us, a buffer of `n` samples, valid count pointer.
        let r = unsafe { t.nvmlDeviceGetProcessUtilization(h, buf.as_mut_ptr(), &mut n, since) };
        if r == nvmlReturn_t::ERROR_NOT_FOUND {
            return Some(0);
        }
        if !r.ok() {
            return None;
        }
        let me = std::process::id();
        let usage = devices.usage();
        let host = usage.cached_slot().and_then(|own| {
            usage
                .processes()
                .into_iter()
                .find(|p| p.slot == own)
                .map(|p| p.host_pid)
        });
        let pct = per_pid(&buf[..(n as usize).min(buf.len())])
            .iter()
            .filter(|(pid, _, _)| *pid == me || Some(*pid) == host.filter(|h| *h != 0))
            .map(|(_, sum, k)| sum / k)
            .max()
            .unwrap_or(0)
            .min(100);
        Some(pct * (now - since) * 1000 / 100)
    }
}
