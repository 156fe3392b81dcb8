//! NVML's per-process utilisation since the last sample: other containers' and all processes' use of a device, for the burst
//! controller (summed over the processes that are not members of this container's usage region), this
//! process's own device time, for degraded mode (no events to measure launches with), and both this process's
//! and every other process's, for the correction of a shared device's charge (`Engine::share_correct`).
//!
//! This process is found in NVML's samples only by a pid proven to be its own ([`Util::nvml_pid`]): the host
//! pid a diff of NVML's list singled out (`Devices::host_pid`), else its own pid outside any pid namespace.
//! Never by the usage slot's copy, which any process of the container can write, nor by its own pid inside a
//! pid namespace, which may be another process's host pid. No proven pid: no figure. A figure for this
//! process that NVML does not list (no sample for that pid, `NVML_ERROR_NOT_FOUND`) is unknown, not zero: the
//! process launched work, so a missing figure means NVML does not know it by that pid (or was made to fail),
//! and reading it as "used nothing" would give back everything it was charged.

use super::bucket::FULL_RATE;
use super::burst::{self, DeviceUse};
use crate::devices::Devices;
use crate::driver::nvml::Nvml;
use crate::ffi::nvml::{nvmlProcessUtilizationSample_t, nvmlReturn_t};
use crate::time::realtime_us;
use cuquota_core::region::layout::MAX_DEVICES;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Per usage-device entry: NVML's handle and the time of the previous sample. Atomics only, no lock.
pub(crate) struct Util {
    /// NVML handle (0 = not looked up yet, 1 = unavailable).
    handles: [AtomicUsize; MAX_DEVICES],
    /// CLOCK_REALTIME µs of the previous sample.
    last_seen: [AtomicU64; MAX_DEVICES],
    /// CLOCK_REALTIME µs of the previous own-time sample (degraded mode), 0 = none yet.
    own_seen: [AtomicU64; MAX_DEVICES],
    /// CLOCK_REALTIME µs of the previous occupancy sample (shared-device correction), 0 = none yet.
    occ_seen: [AtomicU64; MAX_DEVICES],
    /// Whether this process is in the initial pid namespace: 0 = not looked yet, 1 = yes, 2 = no (or unknown).
    init_ns: AtomicU8,
}

/// Device time (ns) over one sampling window: this process's, read high by NVML's rounding (half a percent of
/// the window), and every other process's, read low by it (their sum, and the largest); their sum read high
/// (what is left unoccupied, switching, is then read low: a neighbour's many near-idle processes cannot push
/// its rounding into this process's switching charge); and the window's length. This process's read low too
/// (`own_low_ns`): the floor on its charge (`Engine::share_correct`) must not charge it NVML's rounding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    pub own_ns: u64,
    pub own_low_ns: u64,
    pub others_ns: u64,
    pub others_max_ns: u64,
    pub others_high_ns: u64,
    pub span_ns: u64,
}

impl Default for Util {
    fn default() -> Self {
        Util {
            handles: std::array::from_fn(|_| AtomicUsize::new(0)),
            last_seen: std::array::from_fn(|_| AtomicU64::new(0)),
            own_seen: std::array::from_fn(|_| AtomicU64::new(0)),
            occ_seen: std::array::from_fn(|_| AtomicU64::new(0)),
            init_ns: AtomicU8::new(0),
        }
    }
}

/// Per pid: (pid, sum of its samples' `smUtil` %, how many samples).
type PerPid = Vec<(u32, u64, u64)>;

/// Each pid's average `smUtil` (percent) over the samples.
fn per_pid(samples: &[nvmlProcessUtilizationSample_t]) -> PerPid {
    let mut per: PerPid = Vec::new();
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

    /// Per-mille of usage entry `entry`'s device that processes outside this container, and all processes, used
    /// since the previous call for it (about `burst::SAMPLE_NS`); `None` when NVML cannot tell.
    pub(crate) fn device_use(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<DeviceUse> {
        let t = nvml.ready()?;
        let h = self.handle(nvml, devices, entry)?;
        let now = realtime_us();
        let last = self.last_seen.get(entry)?.swap(now, Ordering::Relaxed);
        let since = if last == 0 {
            now.saturating_sub(burst::SAMPLE_NS / 1000)
        } else {
            last
        };
        // SAFETY: a handle NVML gave us; `samples` passes a buffer of `n` samples and a valid count pointer.
        let (r, buf) = samples(|p, n| unsafe { t.nvmlDeviceGetProcessUtilization(h, p, n, since) });
        // The tenant-proof membership (the agent's list when it publishes one), not the usage file's slots: a
        // slot forged with a neighbour's host pid must not drop that neighbour out of "others". Our own pid only
        // when proven (in a pid namespace our pid may be a neighbour's host pid).
        let own = [self.nvml_pid(devices).unwrap_or(0)];
        use_of(r, &buf, |pid| devices.is_member(pid, &own))
    }

    /// NVML's samples for usage entry `entry`'s device since the CLOCK_REALTIME µs `seen` holds (swapped for
    /// now): the window's length (µs) and each pid's (pid, sum of smUtil %, samples). `None` on the first call
    /// (the baseline), when NVML cannot tell, or when it has no sample (`NVML_ERROR_NOT_FOUND`).
    fn window(
        &self,
        nvml: &Nvml,
        devices: &Devices,
        entry: usize,
        seen: &AtomicU64,
    ) -> Option<(u64, PerPid)> {
        let t = nvml.ready()?;
        let h = self.handle(nvml, devices, entry)?;
        let now = realtime_us();
        let since = seen.swap(now, Ordering::Relaxed);
        if since == 0 || since >= now {
            return None;
        }
        // SAFETY: a handle NVML gave us; `samples` passes a buffer of `n` samples and a valid count pointer.
        let (r, buf) = samples(|p, n| unsafe { t.nvmlDeviceGetProcessUtilization(h, p, n, since) });
        if !r.ok() {
            return None;
        }
        Some((now - since, per_pid(&buf)))
    }

    /// Device time (ns) this process used on usage entry `entry`'s device since the previous call, from NVML's
    /// per-process utilisation; `None` on the first call (the baseline), when NVML cannot tell or does not list
    /// this process.
    pub(crate) fn own_busy_ns(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<u64> {
        let (span_us, per) = self.window(nvml, devices, entry, self.own_seen.get(entry)?)?;
        let me = self.nvml_pid(devices)?;
        let (_, sum, k) = per.into_iter().find(|(pid, _, _)| *pid == me)?;
        Some((sum / k).min(100) * span_us * 10)
    }

    /// This process's and every other process's device time on usage entry `entry`'s device since the previous
    /// call; `None` on the first call, when NVML cannot tell or does not list this process. NVML's figures are
    /// whole percent of the window: this process's is taken half a percent high, the others' half a percent low
    /// each, so that rounding never makes this process's look smaller than it was.
    pub(crate) fn occupancy(&self, nvml: &Nvml, devices: &Devices, entry: usize) -> Option<Occupancy> {
        let (span_us, per) = self.window(nvml, devices, entry, self.occ_seen.get(entry)?)?;
        let me = self.nvml_pid(devices)?;
        occupancy_of(me, span_us * 1000, &per)
    }

    /// The pid NVML knows this process by, when that is proven: the host pid a diff singled out, else the own
    /// pid in the initial pid namespace (there it is the host's). `None` otherwise: no figure is read.
    fn nvml_pid(&self, devices: &Devices) -> Option<u32> {
        if let Some(p) = devices.host_pid() {
            return Some(p);
        }
        let init = match self.init_ns.load(Ordering::Relaxed) {
            0 => {
                let yes = in_initial_pid_namespace();
                self.init_ns.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
                yes
            }
            v => v == 1,
        };
        init.then(std::process::id)
    }

    /// In a forked child: looked at again (the parent may have unshared a pid namespace for its children).
    pub(crate) fn forget_in_child(&self) {
        self.init_ns.store(0, Ordering::Relaxed);
    }
}

/// Most samples read at once: NVML keeps about a second of samples per process, so this covers some hundreds
/// of GPU processes; a larger answer is unknown (`INSUFFICIENT_SIZE`), never a partial sum.
const MAX_SAMPLES: usize = 16_384;

/// NVML's utilisation samples through `call(buffer, count in/out)`: 128 first, then, on
/// `NVML_ERROR_INSUFFICIENT_SIZE`, the count NVML asked for (bounded by [`MAX_SAMPLES`]), a few tries as the list
/// may grow in between. The answer's code and the samples it filled.
fn samples(
    mut call: impl FnMut(*mut nvmlProcessUtilizationSample_t, &mut c_uint) -> nvmlReturn_t,
) -> (nvmlReturn_t, Vec<nvmlProcessUtilizationSample_t>) {
    let mut want = 128usize;
    let mut r = nvmlReturn_t::ERROR_INSUFFICIENT_SIZE;
    for _ in 0..3 {
        let mut buf = vec![nvmlProcessUtilizationSample_t::default(); want];
        let mut n = want as c_uint;
        r = call(buf.as_mut_ptr(), &mut n);
        if r == nvmlReturn_t::ERROR_INSUFFICIENT_SIZE && (n as usize) > want {
            // Some room for samples added before the next call.
            want = (n as usize).saturating_add(64);
            if want > MAX_SAMPLES {
                break;
            }
            continue;
        }
        buf.truncate(if r.ok() { n as usize } else { 0 });
        return (r, buf);
    }
    (r, Vec::new())
}

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO` in Linux's `proc_ns.h`): a kernel constant.
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// Whether this process is in the initial pid namespace, where its pid is the one NVML reports. Not from
/// `NSpid` (a container's own /proc shows it one pid too) but from the namespace's inode.
/// `NSFS_MAGIC` (Linux's `magic.h`): the file system of /proc/<pid>/ns/* files.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Also the file system's magic: a /proc a tenant mounted (FUSE, in its own user and mount namespaces) could
/// show any inode, but not an nsfs file.
#[cold]
fn in_initial_pid_namespace() -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(f) = std::fs::File::open("/proc/self/ns/pid") else {
        return false;
    };
    // SAFETY: all-zero is a valid `statfs` (plain integers).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a `statfs` to fill.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 || st.f_type as i64 != NSFS_MAGIC {
        return false;
    }
    f.metadata().is_ok_and(|m| m.ino() == PROC_PID_INIT_INO)
}

/// [`Util::device_use`] from NVML's answer: each pid's samples averaged, summed over the pids that are not
/// `member`s and over all. Any error is unknown, `NVML_ERROR_NOT_FOUND` ("no samples") too: a process can make its
/// own NVML answer that, and read as "nobody ran" it handed a burst container the whole device beside a busy
/// neighbour.
fn use_of(
    r: nvmlReturn_t,
    samples: &[nvmlProcessUtilizationSample_t],
    member: impl Fn(u32) -> bool,
) -> Option<DeviceUse> {
    if !r.ok() {
        return None;
    }
    let per = per_pid(samples);
    let pm = |&(_, sum, k): &(u32, u64, u64)| sum * 10 / k;
    let others: u64 = per.iter().filter(|(pid, _, _)| !member(*pid)).map(pm).sum();
    let all: u64 = per.iter().map(pm).sum();
    Some(DeviceUse {
        others: others.min(FULL_RATE),
        all: all.min(FULL_RATE),
    })
}

/// [`Util::occupancy`] from each pid's (pid, sum of %, samples) over a window of `span_ns`.
pub(super) fn occupancy_of(me: u32, span_ns: u64, per: &[(u32, u64, u64)]) -> Option<Occupancy> {
    // Each pid's average in per-mille of the window, exact: sum × 10 / k.
    let pm = |sum: u64, k: u64| (sum * 10 / k.max(1)).min(1000);
    let (_, sum, k) = per.iter().find(|(pid, _, _)| *pid == me)?;
    let own_pm = (pm(*sum, *k) + 5).min(1000);
    let own_low_pm = pm(*sum, *k).saturating_sub(5);
    let others = || {
        per.iter()
            .filter(|(pid, _, _)| *pid != me)
            .map(|(_, sum, k)| pm(*sum, *k).saturating_sub(5))
    };
    Some(Occupancy {
        own_ns: span_ns / 1000 * own_pm,
        own_low_ns: span_ns / 1000 * own_low_pm,
        others_ns: span_ns / 1000 * others().sum::<u64>().min(1000),
        others_max_ns: span_ns / 1000 * others().max().unwrap_or(0),
        others_high_ns: span_ns / 1000
            * per
                .iter()
                .filter(|(pid, _, _)| *pid != me)
                .map(|(_, sum, k)| (pm(*sum, *k) + 5).min(1000))
                .sum::<u64>()
                .min(1000),
        span_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, sm: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            smUtil: sm,
            ..Default::default()
        }
    }

    #[test]
    fn others_are_the_non_members_samples_and_no_samples_is_unknown() {
        // The control: pid 9 (not a member) at 70 % and 50 % averages 60 %; member 7 is left out.
        let s = [sample(7, 30), sample(9, 70), sample(9, 50)];
        // The device's use counts every pid: 30 % + 60 %.
        let u = |others, all| Some(DeviceUse { others, all });
        assert_eq!(use_of(nvmlReturn_t::SUCCESS, &s, |p| p == 7), u(600, 900));
        assert_eq!(use_of(nvmlReturn_t::SUCCESS, &[], |_| false), u(0, 0));
        // NOT_FOUND ("no samples") is unknown, as any error: never "nobody else ran".
        assert_eq!(use_of(nvmlReturn_t::ERROR_NOT_FOUND, &[], |_| false), None);
        assert_eq!(use_of(nvmlReturn_t::ERROR_UNKNOWN, &s, |_| false), None);
    }

    /// A fake NVML with `have` samples (pid i, 1 %): NVML's size protocol.
    fn fake(have: usize) -> impl FnMut(*mut nvmlProcessUtilizationSample_t, &mut c_uint) -> nvmlReturn_t {
        move |p, n| {
            if (*n as usize) < have {
                *n = have as c_uint;
                return nvmlReturn_t::ERROR_INSUFFICIENT_SIZE;
            }
            for i in 0..have {
                // SAFETY: the caller's buffer holds `*n` >= `have` samples.
                unsafe { *p.add(i) = sample(i as u32 + 1, 1) };
            }
            *n = have as c_uint;
            nvmlReturn_t::SUCCESS
        }
    }

    #[test]
    fn a_crowded_device_is_read_whole_and_an_oversized_one_is_unknown() {
        // The control: 5 samples fit the first buffer.
        let (r, v) = samples(fake(5));
        assert_eq!((r, v.len()), (nvmlReturn_t::SUCCESS, 5));
        // 300 processes (main gave up at 128: unknown, so the correction switched off): all read.
        let (r, v) = samples(fake(300));
        assert_eq!((r, v.len()), (nvmlReturn_t::SUCCESS, 300));
        // pid 300, the last sample, counts: 1 % = 10 per-mille.
        assert_eq!(use_of(r, &v, |p| p != 300).map(|u| u.others), Some(10));
        // More than the bound: unknown, never a partial list.
        let (r, v) = samples(fake(MAX_SAMPLES + 1));
        assert_eq!((r, v.len()), (nvmlReturn_t::ERROR_INSUFFICIENT_SIZE, 0));
        assert_eq!(use_of(r, &v, |_| false), None);
    }

    #[test]
    fn the_initial_namespace_check_needs_nsfs() {
        // This test runs on the host or in a container: whichever, the check agrees with the inode alone only
        // when /proc/self/ns/pid is on nsfs, which a real /proc always is.
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).ok();
        assert_eq!(in_initial_pid_namespace(), ino == Some(PROC_PID_INIT_INO));
        assert!(!std::path::Path::new("/proc/self/ns/pid").is_dir());
    }

    #[test]
    fn rounding_reads_own_time_high_and_others_low_and_an_unlisted_self_is_unknown() {
        let span = 200_000_000;
        // 30 % and 70 %: own 30.5 % of 200 ms, the other 69.5 %.
        let o = occupancy_of(7, span, &[(7, 30, 1), (9, 70, 1)]).unwrap();
        assert_eq!(
            o,
            Occupancy {
                own_ns: 61_000_000,
                own_low_ns: 59_000_000,
                others_ns: 139_000_000,
                others_max_ns: 139_000_000,
                others_high_ns: 141_000_000,
                span_ns: span
            }
        );
        // Several samples are averaged.
        let o = occupancy_of(7, span, &[(7, 60, 2), (9, 0, 1)]).unwrap();
        assert_eq!(
            o,
            Occupancy {
                own_ns: 61_000_000,
                own_low_ns: 59_000_000,
                others_ns: 0,
                others_max_ns: 0,
                others_high_ns: 1_000_000,
                span_ns: span
            }
        );
        // Not listed: unknown, never "used nothing".
        assert_eq!(occupancy_of(7, span, &[(9, 70, 1)]), None);
        assert_eq!(occupancy_of(7, span, &[]), None);
    }
}
