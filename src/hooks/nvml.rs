//! NVML as the container should see it: a GPU the size of its cap, holding only its own processes.
//!
//! - `nvmlDeviceGetMemoryInfo` / `_v2`: total = cap, used = the container's usage, free = total − used, each
//!   clamped by the real values; `_v2`'s `version` is the caller's and `reserved` the driver's.
//! - The process lists, compute, graphics and MPS compute (`nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses`,
//!   bare, `_v2`, `_v3`; and `nvmlDeviceGetRunningProcessDetailList` v1, any mode): only the container's processes
//!   (`Devices::is_member`): the members the agent publishes in its limits file when it does (tenant-proof),
//!   else processes owning a live slot in the usage region (by pid, or by the NVML pid a slot recorded — in a
//!   pid namespace the host pid `memory::host_pid` learns; cooperative: a tenant can write any pid there). The size protocol is kept after filtering: a buffer too small for the *filtered* list gets
//!   `NVML_ERROR_INSUFFICIENT_SIZE` with the filtered count.
//! - `nvmlDeviceGetProcessUtilization` and `nvmlDeviceGetProcessesUtilizationInfo` (v1): the same filter over
//!   the samples.
//! - `nvmlDeviceGetAccountingPids`: the same filter and size protocol; `nvmlDeviceGetAccountingStats` of a pid
//!   that is not the container's answers `NVML_ERROR_NOT_FOUND`, as for a pid NVML does not know; so does
//!   `nvmlSystemGetProcessName`.
//! - `nvmlDeviceGetEncoderSessions` and `nvmlDeviceGetFBCSessions`: the same filter over the sessions (by
//!   owner pid) and their size protocol (`*sessionCount` 0 asks for the count: `NVML_SUCCESS` and the
//!   container's count). Their aggregates (`nvmlDeviceGetEncoderStats`, `nvmlDeviceGetFBCStats`,
//!   `nvmlDeviceGetEncoderUtilization`) name no process and pass through, like `nvmlDeviceGetUtilizationRates`.
//! - Refused (`refuse`): the vGPU host's per-process calls (`nvmlVgpuInstanceGet{Encoder,FBC}Sessions`,
//!   `nvmlVgpuInstanceGetAccounting{Pids,Stats}`, `nvmlDeviceGetVgpu{ProcessUtilization,ProcessesUtilizationInfo}`)
//!   answer `NVML_ERROR_NOT_SUPPORTED`, as they do everywhere but on a vGPU hypervisor: they name processes of
//!   the guest VMs, never of the container, so there is nothing of its own to show. Clearing accounting
//!   records (`nvmlDeviceClearAccountingPids`, `nvmlVgpuInstanceClearAccountingPids`) or switching accounting
//!   (`nvmlDeviceSetAccountingMode`: disabling erases every process's records) answers
//!   `NVML_ERROR_NO_PERMISSION`: it would erase other containers' records.
//! - A list call with a NULL count, or a NULL buffer with a non-zero count, answers
//!   `NVML_ERROR_INVALID_ARGUMENT` without the real call (which would write the device-wide count).
//! - Which limit applies to an NVML device: the CUDA ordinal this process knows for that UUID; in an NVML-only
//!   process (nvidia-smi) the ordinal `CUDA_VISIBLE_DEVICES` gives it (core's mapping), plus any agent-file entry
//!   for the UUID; failing both, the limit a CUDA process of the container last reported in the usage entry.
//! - `nvmlInit*`: forwarded; hooking them makes a bad configuration fail closed for NVML users too.

use crate::ffi::nvml::*;
use crate::state::Shim;
use cuquota_core::region::layout::parse_uuid;
use std::ffi::{c_char, c_uint, CStr};

/// `nvmlInit*`: forwarded (exported so that a bad configuration fails closed for NVML users too).
pub(crate) fn forward(_s: &Shim, call: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    call()
}

/// (cap, container usage) for an NVML device, or `None` when no limit applies (→ pass-through).
fn budget(s: &Shim, device: nvmlDevice_t) -> Option<(u64, u64)> {
    let nvml = s.nvml.real();
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_BUFFER_SIZE];
    // SAFETY: buffer of the stated length.
    if !unsafe { nvml.nvmlDeviceGetUUID(device, buf.as_mut_ptr(), buf.len() as c_uint) }.ok() {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the buffer on success; the last byte is still 0 regardless.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let uuid = parse_uuid(&text)?;
    // A device this process already uses through CUDA: its ordinal is known.
    if let Some((dev, _)) = s.devices.known().find(|(_, u)| *u == uuid) {
        let cap = s.devices.memory_cap(dev)?;
        return Some((cap, s.devices.usage().container_held(dev.id)));
    }
    // NVML-only: map by CUDA_VISIBLE_DEVICES (core), tighten with the agent file's entry for the UUID.
    let mut index: c_uint = 0;
    // SAFETY: valid out-pointer.
    let ordinal = if unsafe { nvml.nvmlDeviceGetIndex(device, &mut index) }.ok() {
        cuquota_core::visible_devices::cuda_ordinal(
            s.devices.config().visible_devices.as_ref(),
            index,
            &text,
            &[],
        )
    } else {
        None
    };
    let entry = s.devices.usage().find_device(&uuid);
    // No limit of our own: the effective limit a CUDA process of the container last reported for this device.
    let cap = s.devices.effective(ordinal, &uuid).memory.or_else(|| {
        let id = entry?;
        s.devices
            .usage()
            .devices()
            .into_iter()
            .find(|d| d.id == id)?
            .limits
            .memory
    })?;
    let used = entry.map_or(0, |id| s.devices.usage().container_held(id));
    Some((cap, used))
}

/// (total, used, free) a capped device reports.
pub(crate) fn capped_memory(cap: u64, used: u64, real_total: u64, real_free: u64) -> (u64, u64, u64) {
    let total = cap.min(real_total);
    let used = used.min(total);
    (total, used, (total - used).min(real_free))
}

/// `nvmlDeviceGetMemoryInfo` and `_v2` (whose `version` is the caller's and `reserved` the driver's).
///
/// # Safety
/// `memory` as NVML's contract says.
pub(crate) unsafe fn memory_info<T: MemoryInfo>(
    s: &Shim,
    call: impl FnOnce() -> nvmlReturn_t,
    device: nvmlDevice_t,
    memory: *mut T,
) -> nvmlReturn_t {
    let r = call();
    if !r.ok() || memory.is_null() {
        return r;
    }
    s.devices.maybe_reclaim();
    if let Some((cap, used)) = budget(s, device) {
        // SAFETY: the caller's struct, just filled by NVML.
        let (total, u, free) = unsafe { &mut *memory }.fields();
        (*total, *u, *free) = capped_memory(cap, used, *total, *free);
    }
    r
}

/// This process's pids as NVML may list it: its own and, in a pid namespace, the host pid it learned.
fn own_pids(s: &Shim) -> [u32; 2] {
    [std::process::id(), s.mem.overhead().host_pid().unwrap_or(0)]
}

/// The container's records of a real list: the one membership filter every per-process NVML call goes through.
fn members<T>(s: &Shim, list: Vec<T>, pid: impl Fn(&T) -> c_uint) -> Vec<T> {
    s.devices.maybe_reclaim();
    let own = own_pids(s);
    list.into_iter()
        .filter(|p| s.devices.is_member(pid(p), &own))
        .collect()
}

/// Writes the filtered `mine` back with NVML's size protocol: `*count` = its length; a buffer too small for
/// it (or NULL) gets `NVML_ERROR_INSUFFICIENT_SIZE`; an empty list answers `empty`.
///
/// # Safety
/// `count` non-NULL; `buf` NULL or valid for the `*count` records the caller passed.
unsafe fn write_back<T: Copy>(
    mine: &[T],
    count: *mut c_uint,
    buf: *mut T,
    empty: nvmlReturn_t,
) -> nvmlReturn_t {
    // SAFETY: `count` non-NULL, the caller's in/out parameter.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = mine.len() as c_uint };
    if mine.is_empty() {
        return empty;
    }
    if buf.is_null() || room < mine.len() {
        return nvmlReturn_t::ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `room` ≥ len records.
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), buf, mine.len()) };
    nvmlReturn_t::SUCCESS
}

/// The container's part of a `(device, count, buffer)` list call: a malformed call refused, the whole real list
/// fetched into our own buffer, filtered by each record's pid. `Err`: what to answer.
///
/// # Safety
/// `count` NULL or valid to read.
unsafe fn container_list<T: Copy + Default>(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *const c_uint,
    buf: *const T,
    pid: impl Fn(&T) -> c_uint,
) -> Result<Vec<T>, nvmlReturn_t> {
    // SAFETY: as `malformed` requires.
    if let Some(r) = unsafe { malformed(count, buf) } {
        return Err(r);
    }
    let list = crate::driver::nvml::list(64, 1 << 16, |n, b| real(device, n, b))?;
    Ok(members(s, list, pid))
}

/// The compute, graphics and MPS process lists (bare, `_v2`, `_v3`): the real list → the container's processes,
/// written back with NVML's size protocol.
///
/// # Safety
/// `count`/`infos` as the NVML function requires.
pub(crate) unsafe fn running_processes<T: ProcessInfo>(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    // SAFETY: the caller's `count`.
    let mine = match unsafe { container_list(s, real, device, count, infos, T::pid) } {
        Ok(m) => m,
        Err(r) => return r,
    };
    // SAFETY: `count` non-NULL; `infos` as the caller passed it.
    unsafe { write_back(&mine, count, infos, nvmlReturn_t::SUCCESS) }
}

/// `nvmlDeviceGetEncoderSessions` / `nvmlDeviceGetFBCSessions`: the real sessions → the container's (by owner
/// pid), with their size protocol: `*count` 0 asks for the count (`NVML_SUCCESS` with the container's); a
/// buffer too small for the container's gets `NVML_ERROR_INSUFFICIENT_SIZE` and their count.
///
/// # Safety
/// `count`/`infos` as the NVML function requires.
pub(crate) unsafe fn sessions<T: SessionInfo>(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    // SAFETY: the caller's `count`.
    let mine = match unsafe { container_list(s, real, device, count, infos, T::pid) } {
        Ok(m) => m,
        Err(r) => return r,
    };
    // SAFETY: `count` non-NULL, the caller's in/out parameter.
    if unsafe { *count } == 0 {
        // SAFETY: as above.
        unsafe { *count = mine.len() as c_uint };
        return nvmlReturn_t::SUCCESS;
    }
    // SAFETY: `count` non-NULL; `infos` non-NULL with room for the `*count` the caller passed.
    unsafe { write_back(&mine, count, infos, nvmlReturn_t::SUCCESS) }
}

/// A list call without a count, or with a NULL buffer that claims room: `NVML_ERROR_INVALID_ARGUMENT`, as
/// nvml.h answers, without calling the real function (whose answer to a NULL buffer is the device-wide count,
/// other containers' processes included).
///
/// # Safety
/// `count` NULL or valid to read.
unsafe fn malformed<T>(count: *const c_uint, buf: *const T) -> Option<nvmlReturn_t> {
    // SAFETY: `count` is checked non-NULL before it is read.
    (count.is_null() || (buf.is_null() && unsafe { *count } > 0))
        .then_some(nvmlReturn_t::ERROR_INVALID_ARGUMENT)
}

/// A call refused in every active process (the module's list says why each): `code`, the real library not
/// called.
pub(crate) fn refuse(_s: &Shim, code: nvmlReturn_t) -> nvmlReturn_t {
    code
}

/// `nvmlDeviceGetAccountingPids`: the real list → the container's pids, with the same size protocol (the
/// size query, count 0 and NULL, gets `NVML_ERROR_INSUFFICIENT_SIZE` and the filtered count).
///
/// # Safety
/// `count`/`pids` as the NVML function requires.
pub(crate) unsafe fn accounting_pids(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's `count`.
    let mine = match unsafe { container_list(s, real, device, count, pids, |p| *p) } {
        Ok(m) => m,
        Err(r) => return r,
    };
    // SAFETY: `count` non-NULL; `pids` as the caller passed it.
    unsafe { write_back(&mine, count, pids, nvmlReturn_t::SUCCESS) }
}

/// `nvmlSystemGetProcessName`: another container's pid answers `NVML_ERROR_NOT_FOUND` (the caller's buffer
/// untouched), as a pid NVML does not know does; argument errors are the real library's.
///
/// # Safety
/// `name` as the NVML function requires.
pub(crate) unsafe fn process_name(
    s: &Shim,
    real: impl Fn(c_uint, *mut c_char, c_uint) -> nvmlReturn_t,
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    if name.is_null() || length == 0 || !members(s, vec![pid], |p| *p).is_empty() {
        return real(pid, name, length);
    }
    nvmlReturn_t::ERROR_NOT_FOUND
}

/// `nvmlDeviceGetAccountingStats`: another container's pid answers `NVML_ERROR_NOT_FOUND` (the caller's
/// struct untouched), as a pid NVML does not know does; argument errors are the real library's.
///
/// # Safety
/// `stats` as the NVML function requires.
pub(crate) unsafe fn accounting_stats(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, c_uint, *mut nvmlAccountingStats_t) -> nvmlReturn_t,
    device: nvmlDevice_t,
    pid: c_uint,
    stats: *mut nvmlAccountingStats_t,
) -> nvmlReturn_t {
    if stats.is_null() {
        return real(device, pid, stats);
    }
    let mut mine = nvmlAccountingStats_t::default();
    let r = real(device, pid, &mut mine);
    if !r.ok() {
        return r;
    }
    if members(s, vec![pid], |p| *p).is_empty() {
        return nvmlReturn_t::ERROR_NOT_FOUND;
    }
    // SAFETY: the caller's struct, non-NULL.
    unsafe { *stats = mine };
    r
}

/// `nvmlDeviceGetProcessUtilization`: the real samples → the container's processes, written back with the
/// call's size protocol (a buffer too small for the *filtered* samples gets `NVML_ERROR_INSUFFICIENT_SIZE` and
/// the filtered count; none left is `NVML_ERROR_NOT_FOUND`, as for no samples at all). A size query (NULL
/// buffer) gets the real answer, an upper bound.
///
/// # Safety
/// `samples`/`count` as the NVML function requires.
pub(crate) unsafe fn process_utilization(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut nvmlProcessUtilizationSample_t, *mut c_uint, u64) -> nvmlReturn_t,
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    if count.is_null() || samples.is_null() {
        return real(device, samples, count, last_seen);
    }
    let list = match crate::driver::nvml::list(64, 1 << 16, |n, buf| real(device, buf, n, last_seen)) {
        Ok(l) => l,
        Err(r) => {
            if r == nvmlReturn_t::ERROR_NOT_FOUND {
                // SAFETY: `count` non-NULL, the caller's in/out parameter.
                unsafe { *count = 0 };
            }
            return r;
        }
    };
    let mine = members(s, list, |p| p.pid);
    // SAFETY: `count` non-NULL; `samples` non-NULL, as the caller passed it.
    unsafe { write_back(&mine, count, samples, nvmlReturn_t::ERROR_NOT_FOUND) }
}

/// `nvmlDeviceGetRunningProcessDetailList` (v1, the caller's mode): the real list → the container's
/// processes, with the same size protocol as the process lists (none left is `NVML_SUCCESS`). Another version
/// gets `NVML_ERROR_ARGUMENT_VERSION_MISMATCH` (the shim could not filter it); NULL the real library's answer.
///
/// # Safety
/// `plist` as the NVML function requires.
pub(crate) unsafe fn process_detail_list(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut nvmlProcessDetailList_t) -> nvmlReturn_t,
    device: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_t,
) -> nvmlReturn_t {
    if plist.is_null() {
        return real(device, plist);
    }
    // Only the version the shim can filter: another one would reach the real library unfiltered.
    // SAFETY: non-NULL, the caller's struct.
    if unsafe { (*plist).version } != NVML_PROCESS_DETAIL_LIST_V1 {
        return nvmlReturn_t::ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: non-NULL, the caller's struct.
    let plist = unsafe { &mut *plist };
    let mode = plist.mode;
    let list = crate::driver::nvml::list(64, 1 << 16, |n, buf| {
        let mut ours = nvmlProcessDetailList_t {
            version: NVML_PROCESS_DETAIL_LIST_V1,
            mode,
            // SAFETY: `list` passes a valid count.
            numProcArrayEntries: unsafe { *n },
            procArray: buf,
        };
        let r = real(device, &mut ours);
        // SAFETY: as above.
        unsafe { *n = ours.numProcArrayEntries };
        r
    });
    let mine = match list {
        Ok(l) => members(s, l, |p| p.pid),
        Err(r) => return r,
    };
    // SAFETY: the count field is ours to write; the array is the caller's, valid for the count it passed.
    unsafe {
        write_back(
            &mine,
            &mut plist.numProcArrayEntries,
            plist.procArray,
            nvmlReturn_t::SUCCESS,
        )
    }
}

/// `nvmlDeviceGetProcessesUtilizationInfo` (v1): the real samples → the container's, with the same protocol
/// as [`process_utilization`]; a NULL array is a size query answered with the filtered count. Another version
/// gets `NVML_ERROR_ARGUMENT_VERSION_MISMATCH` (the shim could not filter it); NULL the real library's answer.
///
/// # Safety
/// `info` as the NVML function requires.
pub(crate) unsafe fn processes_utilization_info(
    s: &Shim,
    real: impl Fn(nvmlDevice_t, *mut nvmlProcessesUtilizationInfo_t) -> nvmlReturn_t,
    device: nvmlDevice_t,
    info: *mut nvmlProcessesUtilizationInfo_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return real(device, info);
    }
    // Only the version the shim can filter: another one would reach the real library unfiltered.
    // SAFETY: non-NULL, the caller's struct.
    if unsafe { (*info).version } != NVML_PROCESSES_UTILIZATION_INFO_V1 {
        return nvmlReturn_t::ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: non-NULL, the caller's struct.
    let info = unsafe { &mut *info };
    let last_seen = info.lastSeenTimeStamp;
    let list = crate::driver::nvml::list(64, 1 << 16, |n, buf| {
        let mut ours = nvmlProcessesUtilizationInfo_t {
            version: NVML_PROCESSES_UTILIZATION_INFO_V1,
            // SAFETY: `list` passes a valid count.
            processSamplesCount: unsafe { *n },
            lastSeenTimeStamp: last_seen,
            procUtilArray: buf,
        };
        let r = real(device, &mut ours);
        // SAFETY: as above.
        unsafe { *n = ours.processSamplesCount };
        r
    });
    let list = match list {
        Ok(l) => l,
        Err(r) => {
            if r == nvmlReturn_t::ERROR_NOT_FOUND {
                info.processSamplesCount = 0;
            }
            return r;
        }
    };
    let mine = members(s, list, |p| p.pid);
    // SAFETY: the count field is ours to write; the array is the caller's, valid for the count it passed.
    unsafe {
        write_back(
            &mine,
            &mut info.processSamplesCount,
            info.procUtilArray,
            nvmlReturn_t::ERROR_NOT_FOUND,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::capped_memory;

    #[test]
    fn capped_memory_values() {
        const G: u64 = 1 << 30;
        assert_eq!(capped_memory(G, G / 4, 16 * G, 15 * G), (G, G / 4, 3 * G / 4));
        assert_eq!(capped_memory(G, 2 * G, 16 * G, 15 * G), (G, G, 0));
        assert_eq!(capped_memory(32 * G, 0, 16 * G, G), (16 * G, 0, G));
    }
}
