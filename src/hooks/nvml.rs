//! NVML as the container should see it: a GPU the size of its cap, holding only its own processes.
//!
//! - `nvmlDeviceGetMemoryInfo` / `_v2`: total = cap, used = the container's usage, free = total − used, each
//!   clamped by the real values; `_v2`'s `version` is the caller's and `reserved` the driver's.
//! - `nvmlDeviceGetComputeRunningProcesses` (bare, `_v2`, `_v3`): only processes owning a live slot in the usage
//!   region (by pid, or by the NVML pid a slot recorded — in a pid namespace the host pid `hooks::context`
//!   learns). The size protocol is kept after filtering: a buffer too small for the *filtered* list gets
//!   `NVML_ERROR_INSUFFICIENT_SIZE` with the filtered count.
//! - Which limit applies to an NVML device: the CUDA ordinal this process knows for that UUID; in an NVML-only
//!   process (nvidia-smi) the ordinal `CUDA_VISIBLE_DEVICES` gives it (core's mapping), plus any agent-file entry
//!   for the UUID; failing both, the limit a CUDA process of the container last reported in the usage entry.
//! - `nvmlInit*`: forwarded; hooking them makes a bad configuration fail closed for NVML users too.

#![allow(non_snake_case)]

use crate::ffi::nvml::*;
use crate::state::Shim;
use cuquota_core::region::layout::parse_uuid;
use std::ffi::{c_char, c_uint, CStr};

/// Hook of `nvmlInit`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlInit(s: &Shim) -> nvmlReturn_t {
    // SAFETY: the guard only yields Active with NVML loaded.
    unsafe { table(s).nvmlInit() }
}

/// Hook of `nvmlInit_v2`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlInit_v2(s: &Shim) -> nvmlReturn_t {
    // SAFETY: forwarded.
    unsafe { table(s).nvmlInit_v2() }
}

/// Hook of `nvmlInitWithFlags`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlInitWithFlags(s: &Shim, flags: c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded.
    unsafe { table(s).nvmlInitWithFlags(flags) }
}

/// The real NVML (an active process's NVML exports only run when it loaded).
fn table(s: &Shim) -> &crate::driver::nvml::NvmlTable {
    static EMPTY: std::sync::OnceLock<crate::driver::nvml::NvmlTable> = std::sync::OnceLock::new();
    s.nvml
        .table()
        .unwrap_or_else(|| EMPTY.get_or_init(|| crate::driver::nvml::NvmlTable::empty(false)))
}

/// (cap, container usage) for an NVML device, or `None` when no limit applies (→ pass-through).
fn budget(s: &Shim, device: nvmlDevice_t) -> Option<(u64, u64)> {
    let nvml = table(s);
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
        let cap = s.mem.limit(dev)?;
        return Some((cap, s.mem.container_used(dev)));
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
    let used = entry.map_or(0, |id| s.devices.usage().container_used(id));
    Some((cap, used))
}

/// (total, used, free) a capped device reports.
pub fn capped_memory(cap: u64, used: u64, real_total: u64, real_free: u64) -> (u64, u64, u64) {
    let total = cap.min(real_total);
    let used = used.min(total);
    (total, used, (total - used).min(real_free))
}

/// Hook of `nvmlDeviceGetMemoryInfo`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlDeviceGetMemoryInfo(
    s: &Shim,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded unchanged.
    let r = unsafe { table(s).nvmlDeviceGetMemoryInfo(device, memory) };
    if !r.ok() || memory.is_null() {
        return r;
    }
    s.mem.maybe_reclaim();
    if let Some((cap, used)) = budget(s, device) {
        // SAFETY: the caller's struct, just filled by NVML.
        let m = unsafe { &mut *memory };
        (m.total, m.used, m.free) = capped_memory(cap, used, m.total, m.free);
    }
    r
}

/// Hook of `nvmlDeviceGetMemoryInfo_v2`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlDeviceGetMemoryInfo_v2(
    s: &Shim,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded unchanged (NVML checks `version`).
    let r = unsafe { table(s).nvmlDeviceGetMemoryInfo_v2(device, memory) };
    if !r.ok() || memory.is_null() {
        return r;
    }
    s.mem.maybe_reclaim();
    if let Some((cap, used)) = budget(s, device) {
        // SAFETY: the caller's struct, just filled by NVML.
        let m = unsafe { &mut *memory };
        // `reserved` is the driver's and stays; what the container sees is its cap.
        (m.total, m.used, m.free) = capped_memory(cap, used, m.total, m.free);
    }
    r
}

/// Real list → the container's processes, written back with NVML's size protocol.
///
/// # Safety
/// `count`/`infos` as the NVML function requires.
unsafe fn filtered<T: ProcessInfo>(
    s: &Shim,
    count: *mut c_uint,
    infos: *mut T,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> nvmlReturn_t {
    // Malformed calls (no count; a NULL buffer claiming room) get the real library's own error.
    // SAFETY: `count` is checked non-NULL before it is read.
    if count.is_null() || (infos.is_null() && unsafe { *count } > 0) {
        return call(count, infos);
    }
    // Fetch the whole real list into our own buffer.
    let list = match crate::driver::nvml::list(64, 1 << 16, call) {
        Ok(l) => l,
        Err(r) => return r,
    };
    s.mem.maybe_reclaim();
    let mine: Vec<T> = list
        .into_iter()
        .filter(|p| s.devices.usage().is_member(p.pid()))
        .collect();
    // SAFETY: `count` non-NULL, the caller's in/out parameter.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = mine.len() as c_uint };
    if mine.is_empty() {
        return nvmlReturn_t::SUCCESS;
    }
    if infos.is_null() || room < mine.len() {
        return nvmlReturn_t::ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `room` ≥ len records.
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), infos, mine.len()) };
    nvmlReturn_t::SUCCESS
}

/// Hook of `nvmlDeviceGetComputeRunningProcesses` (v1 records).
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses(
    s: &Shim,
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded with the caller's or our own buffers.
    unsafe {
        filtered(s, infoCount, infos, |c, i| {
            table(s).nvmlDeviceGetComputeRunningProcesses(device, c, i)
        })
    }
}

/// Hook of `nvmlDeviceGetComputeRunningProcesses_v2`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(
    s: &Shim,
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: as above.
    unsafe {
        filtered(s, infoCount, infos, |c, i| {
            table(s).nvmlDeviceGetComputeRunningProcesses_v2(device, c, i)
        })
    }
}

/// Hook of `nvmlDeviceGetComputeRunningProcesses_v3`.
///
/// # Safety
/// NVML contract.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(
    s: &Shim,
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: as above.
    unsafe {
        filtered(s, infoCount, infos, |c, i| {
            table(s).nvmlDeviceGetComputeRunningProcesses_v3(device, c, i)
        })
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
