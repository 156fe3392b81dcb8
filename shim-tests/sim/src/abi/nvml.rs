//! NVML exports (libnvidia-ml.so.1 is a symlink to this library).

use std::ffi::{c_char, c_void};

use super::{cstr, nout, nvml_fn, write_cstr};
use crate::config::format_uuid;
use crate::device;
use crate::nvml::{self, handle, phys_of, sim};
use crate::types::*;

type Device = *mut c_void;

/// Copies a string answer; NVML_ERROR_INSUFFICIENT_SIZE when it does not fit with its NUL.
///
/// # Safety
/// A non-NULL `buf` must be valid for `len` bytes.
unsafe fn nstr(buf: *mut c_char, len: u32, s: &str) -> Result<(), NvmlReturn> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: forwarded contract; the string fits.
    unsafe { write_cstr(buf, len as usize, s) }.map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

fn memory(dev: Device) -> Result<(u64, u64, u64), NvmlReturn> {
    let sim = sim()?;
    let p = phys_of(sim, dev)?;
    let (free, total) = sim.mem_info(p);
    Ok((total, free, total - free))
}

/// The process list into a caller array of `T`.
///
/// # Safety
/// `count` must be valid; `infos` must hold `*count` entries when non-NULL.
unsafe fn running<T>(
    list: nvml::ProcessList,
    dev: Device,
    count: *mut u32,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> Result<(), NvmlReturn> {
    let sim = sim()?;
    let p = phys_of(sim, dev)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = nvml::listed(sim, p, list)?;
    // SAFETY: count is valid; infos holds *count entries (contract).
    unsafe {
        let cap = *count as usize;
        // infos may be NULL only for the size query (*infoCount == 0).
        if infos.is_null() && cap != 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        *count = procs.len() as u32;
        if procs.len() > cap {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, mem)) in procs.iter().enumerate() {
            infos.add(i).write_unaligned(make(*pid, *mem));
        }
    }
    Ok(())
}

const COMPUTE: nvml::ProcessList = nvml::ProcessList::Compute;
const GRAPHICS: nvml::ProcessList = nvml::ProcessList::Graphics;
const MPS: nvml::ProcessList = nvml::ProcessList::Mps;
const ACCOUNTING: nvml::ProcessList = nvml::ProcessList::Accounting;
const ENCODER: nvml::ProcessList = nvml::ProcessList::Encoder;
const FBC: nvml::ProcessList = nvml::ProcessList::Fbc;

/// Encoder / FBC sessions into a caller array of `T`, one per process holding one (session ids from 1), with
/// their size protocol (nvml.h): `*count` 0 asks for the count (`NVML_SUCCESS`); a smaller buffer gets
/// `NVML_ERROR_INSUFFICIENT_SIZE` and the count.
///
/// # Safety
/// `count` must be valid; `infos` must hold `*count` entries when non-NULL.
unsafe fn sessions<T>(
    list: nvml::ProcessList,
    dev: Device,
    count: *mut u32,
    infos: *mut T,
    make: impl Fn(u32, u32) -> T,
) -> Result<(), NvmlReturn> {
    let sim = sim()?;
    let p = phys_of(sim, dev)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = nvml::listed(sim, p, list)?;
    // SAFETY: count is valid; infos holds *count entries (contract).
    unsafe {
        let cap = *count as usize;
        *count = procs.len() as u32;
        if cap == 0 {
            return Ok(());
        }
        if infos.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if procs.len() > cap {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, _)) in procs.iter().enumerate() {
            infos.add(i).write_unaligned(make(i as u32 + 1, *pid));
        }
    }
    Ok(())
}

fn v1(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV1 {
    NvmlProcessInfoV1 { pid, used_gpu_memory }
}

/// `nvmlProcessInfo_t`: not in a MIG instance (the ids are 0xFFFFFFFF, as nvml.h says for that case).
fn v2(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV2 {
    NvmlProcessInfoV2 {
        pid,
        used_gpu_memory,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    }
}

fn pci_info(dev: Device) -> Result<NvmlPciInfo, NvmlReturn> {
    let sim = sim()?;
    let p = phys_of(sim, dev)?;
    let (domain, bus, devn) = device::pci_ids(p);
    let mut info = NvmlPciInfo {
        domain,
        bus,
        device: devn,
        pci_device_id: device::PCI_DEVICE_ID,
        pci_sub_system_id: device::PCI_SUBSYSTEM_ID,
        ..Default::default()
    };
    let id = device::nvml_pci_bus_id(p);
    info.bus_id[..id.len()].copy_from_slice(id.as_bytes());
    let legacy = format!("{domain:04X}:{bus:02X}:{devn:02X}.0");
    info.bus_id_legacy[..legacy.len()].copy_from_slice(legacy.as_bytes());
    Ok(info)
}

fn by_index(index: u32, dev: *mut Device) -> Result<(), NvmlReturn> {
    let sim = sim()?;
    if index as usize >= sim.cfg.devices.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's out-pointer (NULL-checked).
    unsafe { nout(dev, handle(index as usize)) }
}

/// nvmlErrorString (returns a string, not a code).
#[no_mangle]
pub(crate) extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    crate::errors::c_static(crate::errors::nvml_error_string(result))
}

nvml_fn! {
    fn nvmlInit() {
        nvml::init()
    }

    fn nvmlInit_v2() {
        nvml::init()
    }

    fn nvmlInitWithFlags(flags: u32) {
        nvml::init()
    }

    fn nvmlShutdown() {
        nvml::shutdown()
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: u32) {
        let sim = sim()?;
        nstr(version, length, nvml::driver_string(sim.cfg.driver_version))
    }

    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: u32) {
        let sim = sim()?;
        let v = format!("{}.{}", sim.cfg.driver_version / 1000, nvml::driver_string(sim.cfg.driver_version));
        nstr(version, length, &v)
    }

    fn nvmlSystemGetCudaDriverVersion(v: *mut i32) {
        nout(v, sim()?.cfg.driver_version as i32)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut i32) {
        nout(v, sim()?.cfg.driver_version as i32)
    }

    fn nvmlDeviceGetCount(count: *mut u32) {
        nout(count, sim()?.cfg.devices.len() as u32)
    }

    fn nvmlDeviceGetCount_v2(count: *mut u32) {
        nout(count, sim()?.cfg.devices.len() as u32)
    }

    fn nvmlDeviceGetHandleByIndex(index: u32, dev: *mut Device) {
        by_index(index, dev)
    }

    fn nvmlDeviceGetHandleByIndex_v2(index: u32, dev: *mut Device) {
        by_index(index, dev)
    }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut Device) {
        let sim = sim()?;
        let want = cstr(uuid).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?.to_ascii_lowercase();
        let i = sim
            .cfg
            .devices
            .iter()
            .position(|d| format_uuid("gpu", &d.uuid) == want)
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        nout(dev, handle(i))
    }

    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, dev: *mut Device) {
        let sim = sim()?;
        let want = cstr(bus_id).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?.to_ascii_uppercase();
        let i = (0..sim.cfg.devices.len())
            .find(|&p| {
                let id = device::nvml_pci_bus_id(p);
                id == want || id.trim_start_matches('0') == want.trim_start_matches('0')
            })
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        nout(dev, handle(i))
    }

    fn nvmlDeviceGetIndex(dev: Device, index: *mut u32) {
        let sim = sim()?;
        nout(index, phys_of(sim, dev)? as u32)
    }

    fn nvmlDeviceGetMinorNumber(dev: Device, minor: *mut u32) {
        let sim = sim()?;
        nout(minor, phys_of(sim, dev)? as u32)
    }

    fn nvmlDeviceGetUUID(dev: Device, uuid: *mut c_char, length: u32) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        nstr(uuid, length, &format_uuid("GPU", &sim.cfg.devices[p].uuid))
    }

    fn nvmlDeviceGetName(dev: Device, name: *mut c_char, length: u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        nstr(name, length, device::DEVICE_NAME)
    }

    fn nvmlDeviceGetCudaComputeCapability(dev: Device, major: *mut i32, minor: *mut i32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        nout(major, 9)?;
        nout(minor, 0)
    }

    fn nvmlDeviceGetArchitecture(dev: Device, arch: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        // NVML_DEVICE_ARCH_HOPPER: the compute capability 9.0 above.
        nout(arch, 9)
    }

    fn nvmlEventSetCreate(set: *mut *mut c_void) {
        sim()?;
        let b: Box<std::sync::Mutex<Vec<(usize, u64)>>> = Box::default();
        nout(set, Box::into_raw(b).cast())
    }

    fn nvmlDeviceRegisterEvents(dev: Device, types: u64, set: *mut c_void) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a set nvmlEventSetCreate made and nvmlEventSetFree has not freed (the caller's contract).
        let set = unsafe { &*(set as *const std::sync::Mutex<Vec<(usize, u64)>>) };
        set.lock().unwrap_or_else(|e| e.into_inner()).push((p, types));
        Ok(())
    }

    /// The `CUDASIM_XID` error due at this call on a device of the set registered for XID errors, else
    /// NVML_ERROR_TIMEOUT after `timeoutms` (as a real wait with no event).
    fn nvmlEventSetWait_v2(set: *mut c_void, data: *mut NvmlEventData, timeoutms: u32) {
        sim()?;
        if set.is_null() || data.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let xids = nvml::xids_from(std::env::var("CUDASIM_XID").ok().as_deref()).map_err(|e| {
            eprintln!("{e}");
            NVML_ERROR_UNKNOWN
        })?;
        let call = nvml::EVENT_WAITS.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        // SAFETY: as in nvmlDeviceRegisterEvents.
        let set = unsafe { &*(set as *const std::sync::Mutex<Vec<(usize, u64)>>) };
        let registered = set.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let due = xids.iter().find(|x| {
            x.call == call
                && registered
                    .iter()
                    .any(|(d, t)| *d == x.device && t & NVML_EVENT_TYPE_XID_CRITICAL_ERROR != 0)
        });
        match due {
            Some(x) => nout(
                data,
                NvmlEventData {
                    device: handle(x.device),
                    event_type: NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                    event_data: x.xid,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                },
            ),
            None => {
                std::thread::sleep(std::time::Duration::from_millis(u64::from(timeoutms)));
                Err(NVML_ERROR_TIMEOUT)
            }
        }
    }

    fn nvmlEventSetFree(set: *mut c_void) {
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a set nvmlEventSetCreate made, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(set as *mut std::sync::Mutex<Vec<(usize, u64)>>) });
        Ok(())
    }

    fn nvmlDeviceGetMultiGpuBoard(dev: Device, multi: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        nout(multi, 0)
    }

    fn nvmlDeviceGetMigMode(dev: Device, current: *mut u32, pending: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        nout(current, 0)?;
        nout(pending, 0)
    }

    fn nvmlDeviceGetMemoryInfo(dev: Device, mem: *mut NvmlMemory) {
        let (total, free, used) = memory(dev)?;
        nout(mem, NvmlMemory { total, free, used })
    }

    fn nvmlDeviceGetMemoryInfo_v2(dev: Device, mem: *mut NvmlMemoryV2) {
        if mem.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if (*mem).version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, free, used) = memory(dev)?;
        nout(mem, NvmlMemoryV2 { version: NVML_MEMORY_V2, total, reserved: 0, free, used })
    }

    fn nvmlDeviceGetComputeRunningProcesses(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV1) {
        running(COMPUTE, dev, count, infos, v1)
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(COMPUTE, dev, count, infos, v2)
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(COMPUTE, dev, count, infos, v2)
    }

    fn nvmlDeviceGetGraphicsRunningProcesses(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV1) {
        running(GRAPHICS, dev, count, infos, v1)
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v2(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(GRAPHICS, dev, count, infos, v2)
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v3(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(GRAPHICS, dev, count, infos, v2)
    }

    fn nvmlDeviceGetMPSComputeRunningProcesses(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV1) {
        running(MPS, dev, count, infos, v1)
    }

    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(MPS, dev, count, infos, v2)
    }

    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(dev: Device, count: *mut u32, infos: *mut NvmlProcessInfoV2) {
        running(MPS, dev, count, infos, v2)
    }

    fn nvmlDeviceGetEncoderSessions(dev: Device, count: *mut u32, infos: *mut NvmlEncoderSessionInfo) {
        sessions(ENCODER, dev, count, infos, |session_id, pid| NvmlEncoderSessionInfo {
            session_id,
            pid,
            h_resolution: 1920,
            v_resolution: 1080,
            average_fps: 30,
            ..Default::default()
        })
    }

    fn nvmlDeviceGetFBCSessions(dev: Device, count: *mut u32, infos: *mut NvmlFbcSessionInfo) {
        sessions(FBC, dev, count, infos, |session_id, pid| NvmlFbcSessionInfo {
            session_id,
            pid,
            session_type: 2, // NVML_FBC_SESSION_TYPE_CUDA
            h_max_resolution: 1920,
            v_max_resolution: 1080,
            ..Default::default()
        })
    }

    fn nvmlSystemGetProcessName(pid: u32, name: *mut c_char, length: u32) {
        let sim = sim()?;
        if name.is_null() || length == 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let full = nvml::process_name(sim, pid).ok_or(NVML_ERROR_NOT_FOUND)?;
        // nvml.h: the name is cropped to `length` (with its NUL).
        let cut = full.len().min(length as usize - 1);
        let cut = (0..=cut).rev().find(|i| full.is_char_boundary(*i)).unwrap_or(0);
        nstr(name, length, &full[..cut])
    }

    fn nvmlDeviceGetAccountingMode(dev: Device, mode: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        nout(mode, nvml::shows(ACCOUNTING)? as u32)
    }

    // Accounting (nvml.h): NOT_SUPPORTED while accounting mode is off; the pid list keeps the size protocol
    // (count 0 + NULL asks for the size: INSUFFICIENT_SIZE with the count).
    fn nvmlDeviceGetAccountingPids(dev: Device, count: *mut u32, pids: *mut u32) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if !nvml::shows(ACCOUNTING)? {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let list = nvml::listed(sim, p, ACCOUNTING)?;
        let room = *count as usize;
        *count = list.len() as u32;
        if list.len() > room || (pids.is_null() && !list.is_empty()) {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, _)) in list.iter().enumerate() {
            pids.add(i).write_unaligned(*pid);
        }
        Ok(())
    }

    fn nvmlDeviceGetAccountingStats(dev: Device, pid: u32, stats: *mut NvmlAccountingStats) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if stats.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if !nvml::shows(ACCOUNTING)? {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let (mem, start) = nvml::accounting(sim, p, pid).ok_or(NVML_ERROR_NOT_FOUND)?;
        // Utilisation over the last second (the timeline keeps recent intervals, not a lifetime).
        let (_, samples) = nvml::process_samples(sim, p, 0);
        let util = samples.iter().find(|s| s.0 == pid).map_or(0, |s| s.1);
        nout(
            stats,
            NvmlAccountingStats {
                gpu_utilization: util,
                memory_utilization: 0,
                max_memory_usage: mem,
                time: 0,
                start_time: start,
                is_running: 1,
                reserved: [0; 5],
            },
        )
    }

    fn nvmlDeviceGetRunningProcessDetailList(dev: Device, plist: *mut NvmlProcessDetailListV1) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if plist.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let plist = &mut *plist;
        // nvml.h: an invalid version or mode is INVALID_ARGUMENT here.
        let list = match (plist.version, plist.mode) {
            (NVML_PROCESS_DETAIL_LIST_V1, 0) => COMPUTE,
            (NVML_PROCESS_DETAIL_LIST_V1, 1) => GRAPHICS,
            (NVML_PROCESS_DETAIL_LIST_V1, 2) => MPS,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        let procs = nvml::listed(sim, p, list)?;
        let room = plist.num_proc_array_entries as usize;
        plist.num_proc_array_entries = procs.len() as u32;
        // Size query (0 + NULL): INSUFFICIENT_SIZE with the count, or SUCCESS when there are none.
        if procs.is_empty() {
            return Ok(());
        }
        if plist.proc_array.is_null() || procs.len() > room {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, mem)) in procs.iter().enumerate() {
            plist.proc_array.add(i).write_unaligned(NvmlProcessDetailV1 {
                pid: *pid,
                used_gpu_memory: *mem,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
                used_gpu_cc_protected_memory: 0,
            });
        }
        Ok(())
    }

    fn nvmlDeviceGetUtilizationRates(dev: Device, util: *mut NvmlUtilization) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        nout(util, NvmlUtilization { gpu: nvml::utilization(sim, p), memory: 0 })
    }

    fn nvmlDeviceGetProcessUtilization(
        dev: Device,
        samples: *mut NvmlProcessUtilizationSample,
        count: *mut u32,
        last_seen: u64,
    ) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if samples.is_null() {
            // Size query: how many samples a buffer must hold.
            *count = crate::state::MAX_PROCS as u32;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        let (ts, list) = nvml::process_samples(sim, p, last_seen);
        if list.is_empty() {
            *count = 0;
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if list.len() > *count as usize {
            *count = list.len() as u32;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, sm)) in list.iter().enumerate() {
            samples.add(i).write_unaligned(NvmlProcessUtilizationSample {
                pid: *pid,
                time_stamp: ts,
                sm_util: *sm,
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            });
        }
        *count = list.len() as u32;
        Ok(())
    }

    fn nvmlDeviceGetProcessesUtilizationInfo(dev: Device, info: *mut NvmlProcessesUtilizationInfoV1) {
        let sim = sim()?;
        let p = phys_of(sim, dev)?;
        if info.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let info = &mut *info;
        if info.version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (ts, list) = nvml::process_samples(sim, p, info.last_seen_time_stamp);
        if list.is_empty() {
            info.process_samples_count = 0;
            return Err(NVML_ERROR_NOT_FOUND);
        }
        // nvml.h: a NULL array or one too small answers INSUFFICIENT_SIZE with the size needed.
        if info.proc_util_array.is_null() || list.len() > info.process_samples_count as usize {
            info.process_samples_count = list.len() as u32;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, sm)) in list.iter().enumerate() {
            info.proc_util_array.add(i).write_unaligned(NvmlProcessUtilizationInfoV1 {
                time_stamp: ts,
                pid: *pid,
                sm_util: *sm,
                ..Default::default()
            });
        }
        info.process_samples_count = list.len() as u32;
        Ok(())
    }

    // The simulated GPUs have no NVLink (as PCIe cards): the link queries PyTorch resolves at start-up answer
    // NOT_SUPPORTED after checking their arguments, as nvml.h documents for such devices.
    fn nvmlDeviceGetNvLinkRemoteDeviceType(dev: Device, link: u32, kind: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        if kind.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(dev: Device, link: u32, pci: *mut NvmlPciInfo) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        if pci.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    fn nvmlDeviceGetNvLinkState(dev: Device, link: u32, active: *mut u32) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        if active.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    /// A Hopper GPU outside an NVSwitch fabric: success, with the probe state "not supported".
    fn nvmlDeviceGetGpuFabricInfoV(dev: Device, info: *mut NvmlGpuFabricInfoV3) {
        let sim = sim()?;
        phys_of(sim, dev)?;
        if info.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let version = (*info).version;
        let len = match version {
            NVML_GPU_FABRIC_INFO_V2 => NVML_GPU_FABRIC_INFO_V2 & 0xff_ffff,
            NVML_GPU_FABRIC_INFO_V3 => NVML_GPU_FABRIC_INFO_V3 & 0xff_ffff,
            _ => return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        };
        let answer = NvmlGpuFabricInfoV3 { version, state: NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, ..Default::default() };
        // SAFETY: the caller's struct is at least `len` bytes: the size its version word names.
        std::ptr::copy_nonoverlapping(
            (&answer as *const NvmlGpuFabricInfoV3).cast::<u8>(),
            info.cast::<u8>(),
            len as usize,
        );
        Ok(())
    }

    /// Peers reach each other over PCIe (cuDeviceCanAccessPeer agrees): read, write and PCI are OK between two
    /// different devices; NVLink and atomics are not supported; a device is not its own peer.
    fn nvmlDeviceGetP2PStatus(dev1: Device, dev2: Device, caps: u32, status: *mut u32) {
        let sim = sim()?;
        let a = phys_of(sim, dev1)?;
        let b = phys_of(sim, dev2)?;
        if caps > NVML_P2P_CAPS_INDEX_PCI {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let ok = a != b
            && matches!(caps, NVML_P2P_CAPS_INDEX_READ | NVML_P2P_CAPS_INDEX_WRITE | NVML_P2P_CAPS_INDEX_PCI);
        nout(status, if ok { NVML_P2P_STATUS_OK } else { NVML_P2P_STATUS_NOT_SUPPORTED })
    }

    fn nvmlDeviceGetPciInfo(dev: Device, pci: *mut NvmlPciInfo) {
        nout(pci, pci_info(dev)?)
    }

    fn nvmlDeviceGetPciInfo_v2(dev: Device, pci: *mut NvmlPciInfo) {
        nout(pci, pci_info(dev)?)
    }

    fn nvmlDeviceGetPciInfo_v3(dev: Device, pci: *mut NvmlPciInfo) {
        nout(pci, pci_info(dev)?)
    }
}

/// Simulator-only (no NVML or CUDA counterpart; for benchmarks' ground truth): the device time, in ns, that
/// process `pid` (its host pid, as NVML reports it: pid + that process's `CUDASIM_HOST_PID_OFFSET`; 0: every
/// process) occupied physical device `index` during [`from_ns`, `to_ns`) of
/// CLOCK_MONOTONIC — exactly, from the kernel-interval ring NVML's utilisation is computed from (NVML itself
/// only gives whole percentages). Kernels still queued count only once their time has come; the ring keeps
/// the last 16384 intervals, so ask about recent windows. Needs no nvmlInit. Returns an NVML status.
///
/// # Safety
/// `busy_ns` must be NULL or valid for one write.
#[no_mangle]
pub(crate) unsafe extern "C" fn cudasimDeviceBusyNs(
    index: u32,
    pid: u32,
    from_ns: u64,
    to_ns: u64,
    busy_ns: *mut u64,
) -> NvmlReturn {
    let Ok(sim) = crate::sim::get() else {
        return NVML_ERROR_UNKNOWN;
    };
    if busy_ns.is_null() || index as usize >= sim.cfg.devices.len() || to_ns < from_ns {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let dev = &sim.shared.devices[index as usize];
    let busy = crate::timeline::busy_in(dev, from_ns, to_ns, (pid != 0).then_some(pid));
    // SAFETY: non-NULL and valid for one write (contract).
    unsafe { busy_ns.write_unaligned(busy) };
    NVML_SUCCESS
}
