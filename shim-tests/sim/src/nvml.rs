//! NVML's view of the simulated GPUs: every physical device (CUDA_VISIBLE_DEVICES does not apply), memory as
//! the sum over live processes, the processes with a context or memory on a device, and utilisation from the
//! device timeline's recent kernel intervals.

use std::sync::atomic::{AtomicU32, Ordering::*};

use crate::sim::Sim;
use crate::timeline::{self, now_ns, realtime_us};
use crate::types::*;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// nvmlInit: loads the simulator (printing a configuration error) and counts the init.
pub(crate) fn init() -> Result<(), NvmlReturn> {
    crate::sim::get().map_err(|_| NVML_ERROR_UNKNOWN)?;
    INIT_COUNT.fetch_add(1, AcqRel);
    Ok(())
}

/// nvmlShutdown.
pub(crate) fn shutdown() -> Result<(), NvmlReturn> {
    INIT_COUNT
        .fetch_update(AcqRel, Acquire, |c| c.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}

/// The simulator for an NVML call: NVML_ERROR_UNINITIALIZED before nvmlInit.
pub(crate) fn sim() -> Result<&'static Sim, NvmlReturn> {
    if INIT_COUNT.load(Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    crate::sim::get().map_err(|_| NVML_ERROR_UNINITIALIZED)
}

/// The driver branch string matching a CUDA driver version (e.g. 13000 → "580.82.07").
pub(crate) fn driver_string(cuda: u32) -> &'static str {
    match cuda {
        13000.. => "580.82.07",
        12090.. => "575.57.08",
        12080.. => "570.133.20",
        12040.. => "550.54.15",
        _ => "535.161.08",
    }
}

/// Device handles are addresses of these bytes (stable, distinct, recognisable).
static HANDLES: [u8; crate::config::MAX_DEVICES] = [0; crate::config::MAX_DEVICES];

pub(crate) fn handle(phys: usize) -> *mut std::ffi::c_void {
    &HANDLES[phys] as *const u8 as *mut std::ffi::c_void
}

/// The physical index of a device handle.
pub(crate) fn phys_of(sim: &Sim, dev: *mut std::ffi::c_void) -> Result<usize, NvmlReturn> {
    let base = HANDLES.as_ptr() as usize;
    let i = (dev as usize).wrapping_sub(base);
    if dev.is_null() || i >= sim.cfg.devices.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}

/// Processes using device `phys`: (host pid, bytes).
pub(crate) fn processes(sim: &Sim, phys: usize) -> Vec<(u32, u64)> {
    sim.shared.reclaim_dead();
    sim.shared
        .live_slots()
        .filter_map(|(_, s)| {
            let mem = s.mem_used[phys].load(SeqCst);
            (s.contexts[phys].load(SeqCst) > 0 || mem > 0).then_some((s.host_pid.load(Relaxed), mem))
        })
        .collect()
}

/// The process lists of NVML (compute, graphics, MPS compute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcessList {
    Compute,
    Graphics,
    Mps,
    /// Accounting mode: on for this process's NVML when named (off by default, as on a real GPU).
    Accounting,
    /// Every listed process holds one video encoder session (`nvmlDeviceGetEncoderSessions`).
    Encoder,
    /// Every listed process holds one frame-buffer capture session (`nvmlDeviceGetFBCSessions`).
    Fbc,
}

/// Which lists a process with a context or memory on a device appears in, as this process's NVML answers:
/// `CUDASIM_NVML_LISTS`, a comma list of `compute`, `graphics`, `mps`, `accounting`, `encoder`, `fbc` (default
/// `compute`; empty = none). The simulator runs no graphics or MPS clients; this lets tests make its processes
/// show there, as a process with both a graphics and a compute context, or an MPS client, shows on a real GPU.
/// `accounting` turns accounting mode on (live processes only: the simulator keeps no record of terminated
/// ones). `encoder` and `fbc` give every process with a context or memory on a device one video encoder /
/// frame-buffer capture session there, as a process that encodes video (NVENC) or captures the screen (NvFBC)
/// has on a real GPU.
pub(crate) fn lists_from(raw: Option<&str>) -> Result<Vec<ProcessList>, String> {
    let Some(raw) = raw else {
        return Ok(vec![ProcessList::Compute]);
    };
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "compute" => Ok(ProcessList::Compute),
            "graphics" => Ok(ProcessList::Graphics),
            "mps" => Ok(ProcessList::Mps),
            "accounting" => Ok(ProcessList::Accounting),
            "encoder" => Ok(ProcessList::Encoder),
            "fbc" => Ok(ProcessList::Fbc),
            _ => Err(format!(
                "cudasim: invalid CUDASIM_NVML_LISTS={raw:?}: {s:?} is not compute, graphics, mps, accounting, \
                 encoder or fbc"
            )),
        })
        .collect()
}

/// Whether this process's NVML shows `list`. A bad `CUDASIM_NVML_LISTS` is reported on stderr and answers
/// NVML_ERROR_UNKNOWN.
pub(crate) fn shows(list: ProcessList) -> Result<bool, NvmlReturn> {
    let lists = lists_from(std::env::var("CUDASIM_NVML_LISTS").ok().as_deref()).map_err(|e| {
        eprintln!("{e}");
        NVML_ERROR_UNKNOWN
    })?;
    Ok(lists.contains(&list))
}

/// The processes NVML lists on device `phys` in `list`: (host pid, bytes).
pub(crate) fn listed(sim: &Sim, phys: usize, list: ProcessList) -> Result<Vec<(u32, u64)>, NvmlReturn> {
    Ok(if shows(list)? {
        processes(sim, phys)
    } else {
        Vec::new()
    })
}

/// Accounting stats of a live process on device `phys` known to NVML as `host_pid`: (bytes now — the
/// simulator keeps no peak, so `maxMemoryUsage` is the current figure —, start as CLOCK_REALTIME µs).
pub(crate) fn accounting(sim: &Sim, phys: usize, host_pid: u32) -> Option<(u64, u64)> {
    sim.shared.reclaim_dead();
    let (_, slot) = sim.shared.live_slots().find(|(_, s)| {
        s.host_pid.load(Relaxed) == host_pid
            && (s.contexts[phys].load(SeqCst) > 0 || s.mem_used[phys].load(SeqCst) > 0)
    })?;
    // start_time is /proc/<pid>/stat's starttime: clock ticks after boot; boot = now − /proc/uptime.
    let ticks = slot.start_time.load(Relaxed);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let uptime_us = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0, |s| (s * 1e6) as u64);
    let boot_us = realtime_us().saturating_sub(uptime_us);
    Some((slot.mem_used[phys].load(SeqCst), boot_us + ticks * 1_000_000 / hz))
}

/// `nvmlSystemGetProcessName`: the executable of the process NVML knows as `host_pid` (a simulated process by
/// its host pid, else the pid itself), from /proc: argv[0] as the kernel recorded it, else `comm`.
pub(crate) fn process_name(sim: &Sim, host_pid: u32) -> Option<String> {
    let pid = sim
        .shared
        .live_slots()
        .find(|(_, s)| s.host_pid.load(Relaxed) == host_pid)
        .map_or(host_pid, |(pid, _)| pid);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok();
    let argv0 = cmdline
        .as_deref()
        .and_then(|c| c.split(|b| *b == 0).next())
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned());
    argv0.or_else(|| {
        Some(
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()?
                .trim_end()
                .to_owned(),
        )
    })
}

/// GPU busy percentage over the last second.
pub(crate) fn utilization(sim: &Sim, phys: usize) -> u32 {
    let now = now_ns();
    let from = now.saturating_sub(1_000_000_000);
    let busy = timeline::busy_in(&sim.shared.devices[phys], from, now, None);
    ((busy * 100 + 500_000_000) / 1_000_000_000).min(100) as u32
}

/// Per-process samples since `last_seen_us` (CLOCK_REALTIME µs; at most the last second): (host pid, smUtil %).
/// The samples' timestamp is now.
pub(crate) fn process_samples(sim: &Sim, phys: usize, last_seen_us: u64) -> (u64, Vec<(u32, u32)>) {
    let now = now_ns();
    let now_us = realtime_us();
    let since_ns = now_us
        .saturating_sub(last_seen_us)
        .saturating_mul(1000)
        .min(1_000_000_000);
    let from = now - since_ns.min(now);
    let window = now - from;
    if window == 0 {
        return (now_us, Vec::new());
    }
    let mut per_pid: Vec<(u32, u64)> = Vec::new();
    for (pid, s, e) in timeline::intervals(&sim.shared.devices[phys], from, now) {
        match per_pid.iter_mut().find(|x| x.0 == pid) {
            Some(x) => x.1 += e - s,
            None => per_pid.push((pid, e - s)),
        }
    }
    let samples = per_pid
        .into_iter()
        .map(|(pid, busy)| (pid, ((busy * 100 + window / 2) / window).min(100) as u32))
        .collect();
    (now_us, samples)
}

/// An XID error the simulator raises (`CUDASIM_XID`): on physical device `device`, error `xid`, delivered by
/// this process's `call`-th `nvmlEventSetWait_v2` (from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Xid {
    pub device: usize,
    pub xid: u64,
    pub call: u64,
}

/// Parses `CUDASIM_XID`: a comma list of `DEVICE:XID@CALL`.
pub(crate) fn xids_from(raw: Option<&str>) -> Result<Vec<Xid>, String> {
    let Some(raw) = raw else { return Ok(Vec::new()) };
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let bad =
                || format!("cudasim: invalid CUDASIM_XID={raw:?}: {s:?} is not DEVICE:XID@CALL (1:79@2)");
            let (dev, rest) = s.split_once(':').ok_or_else(bad)?;
            let (xid, call) = rest.split_once('@').ok_or_else(bad)?;
            Ok(Xid {
                device: dev.parse().map_err(|_| bad())?,
                xid: xid.parse().map_err(|_| bad())?,
                call: call.parse().ok().filter(|c| *c > 0).ok_or_else(bad)?,
            })
        })
        .collect()
}

/// `nvmlEventSetWait_v2` calls made by this process.
pub(crate) static EVENT_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(test)]
mod tests {
    #[test]
    fn xid_knob() {
        assert_eq!(
            super::xids_from(Some("1:79@2")).unwrap(),
            vec![super::Xid {
                device: 1,
                xid: 79,
                call: 2
            }]
        );
        assert!(super::xids_from(Some("1:79")).is_err());
        assert!(super::xids_from(Some("1:79@0")).is_err());
        assert!(super::xids_from(None).unwrap().is_empty());
    }

    use super::*;

    #[test]
    fn driver_strings() {
        assert_eq!(driver_string(13000), "580.82.07");
        assert_eq!(driver_string(12080), "570.133.20");
        assert_eq!(driver_string(11000), "535.161.08");
    }

    #[test]
    fn nvml_lists_knob() {
        use ProcessList::*;
        assert_eq!(lists_from(None).unwrap(), vec![Compute]);
        assert_eq!(lists_from(Some("graphics, mps")).unwrap(), vec![Graphics, Mps]);
        assert_eq!(lists_from(Some("accounting")).unwrap(), vec![Accounting]);
        assert_eq!(lists_from(Some("encoder,fbc")).unwrap(), vec![Encoder, Fbc]);
        assert_eq!(lists_from(Some("")).unwrap(), vec![]);
        let e = lists_from(Some("compute,gfx")).unwrap_err();
        assert!(e.contains("CUDASIM_NVML_LISTS") && e.contains("gfx"), "{e}");
    }
}
