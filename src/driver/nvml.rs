//! Every NVML function the shim touches, one line each, in one list ([`nvml_functions!`]) from which the
//! real-function table (here), the exports and their dispatch (`abi::nvml`) and the check against `nvml.h`
//! (`driver::header_check`) are generated; the line format is `driver::cuda`'s, without versions (NVML
//! versions its names: `_v2`, `_v3`). The bare and `_v2` process lists (compute, graphics, MPS) are declared in
//! `nvml.h`'s `NVML_NO_UNVERSIONED_FUNC_DEFS` section.

#![allow(non_snake_case)]

use crate::ffi::nvml::*;
use crate::log::{log, Level};
use std::ffi::{c_char, c_uint};
use std::sync::atomic::{AtomicU8, Ordering};

/// Invokes `$cb! { (call, real) hooked [ … ] helpers [ … ] }` with every NVML function the shim touches.
macro_rules! nvml_functions {
    ($cb:ident) => {
        $cb! { (call, real) hooked [
            // exported so that a bad configuration fails closed for NVML users too
            nvmlInit () => nvml::forward(call);
            nvmlInit_v2 () => nvml::forward(call);
            nvmlInitWithFlags (flags: c_uint) => nvml::forward(call);
            nvmlDeviceGetMemoryInfo (device: nvmlDevice_t, memory: *mut nvmlMemory_t) => nvml::memory_info(call, device, memory);
            nvmlDeviceGetMemoryInfo_v2 (device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) => nvml::memory_info(call, device, memory);
            nvmlDeviceGetComputeRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetComputeRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetComputeRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetGraphicsRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetGraphicsRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetGraphicsRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetMPSComputeRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetMPSComputeRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetMPSComputeRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) => nvml::running_processes(real, device, infoCount, infos);
            nvmlDeviceGetRunningProcessDetailList (device: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t) => nvml::process_detail_list(real, device, plist);
            nvmlDeviceGetProcessesUtilizationInfo (device: nvmlDevice_t, procesesUtilInfo: *mut nvmlProcessesUtilizationInfo_t) => nvml::processes_utilization_info(real, device, procesesUtilInfo);
            nvmlSystemGetProcessName (pid: c_uint, name: *mut c_char, length: c_uint) => nvml::process_name(real, pid, name, length);
            nvmlDeviceGetAccountingPids (device: nvmlDevice_t, count: *mut c_uint, pids: *mut c_uint) => nvml::accounting_pids(real, device, count, pids);
            nvmlDeviceGetAccountingStats (device: nvmlDevice_t, pid: c_uint, stats: *mut nvmlAccountingStats_t) => nvml::accounting_stats(real, device, pid, stats);
            nvmlDeviceGetProcessUtilization (device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t, processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64) => nvml::process_utilization(real, device, utilization, processSamplesCount, lastSeenTimeStamp);
            nvmlDeviceGetEncoderSessions (device: nvmlDevice_t, sessionCount: *mut c_uint, sessionInfos: *mut nvmlEncoderSessionInfo_t) => nvml::sessions(real, device, sessionCount, sessionInfos);
            nvmlDeviceGetFBCSessions (device: nvmlDevice_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlFBCSessionInfo_t) => nvml::sessions(real, device, sessionCount, sessionInfo);
            // refused: they name other containers' processes or erase their records (hooks/nvml.rs says why)
            nvmlDeviceClearAccountingPids (device: nvmlDevice_t) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
            nvmlDeviceSetAccountingMode (device: nvmlDevice_t, mode: nvmlEnableState_t) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
            nvmlVgpuInstanceGetEncoderSessions (vgpuInstance: nvmlVgpuInstance_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlEncoderSessionInfo_t) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
            nvmlVgpuInstanceGetFBCSessions (vgpuInstance: nvmlVgpuInstance_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlFBCSessionInfo_t) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
            nvmlVgpuInstanceGetAccountingPids (vgpuInstance: nvmlVgpuInstance_t, count: *mut c_uint, pids: *mut c_uint) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
            nvmlVgpuInstanceGetAccountingStats (vgpuInstance: nvmlVgpuInstance_t, pid: c_uint, stats: *mut nvmlAccountingStats_t) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
            nvmlVgpuInstanceClearAccountingPids (vgpuInstance: nvmlVgpuInstance_t) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
            nvmlDeviceGetVgpuProcessUtilization (device: nvmlDevice_t, lastSeenTimeStamp: u64, vgpuProcessSamplesCount: *mut c_uint, utilizationSamples: *mut nvmlVgpuProcessUtilizationSample_t) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
            nvmlDeviceGetVgpuProcessesUtilizationInfo (device: nvmlDevice_t, vgpuProcUtilInfo: *mut nvmlVgpuProcessesUtilizationInfo_t) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
        ] helpers [
            nvmlDeviceGetCount_v2 (deviceCount: *mut c_uint);
            nvmlDeviceGetHandleByIndex_v2 (index: c_uint, device: *mut nvmlDevice_t);
            nvmlDeviceGetHandleByUUID (uuid: *const c_char, device: *mut nvmlDevice_t);
            nvmlDeviceGetUUID (device: nvmlDevice_t, uuid: *mut c_char, length: c_uint);
            nvmlDeviceGetIndex (device: nvmlDevice_t, index: *mut c_uint);
        ] }
    };
}
pub(crate) use nvml_functions;

/// The real-function table from both lists.
macro_rules! nvml_table {
    ( $call:tt hooked [ $($hooked:tt)* ] helpers [ $($helpers:tt)* ] ) => {
        crate::driver::function_table! {
            /// Real NVML entry points.
            NvmlTable -> nvmlReturn_t;
            missing_library = nvmlReturn_t::ERROR_LIBRARY_NOT_FOUND,
            missing_symbol = nvmlReturn_t::ERROR_FUNCTION_NOT_FOUND;
            [ $($hooked)* $($helpers)* ]
        }
    };
}
nvml_functions!(nvml_table);

/// NVML as the shim uses it: the real library (if it loaded) and our own `nvmlInit_v2`, done on first use.
pub struct Nvml {
    table: Option<NvmlTable>,
    /// 0 = not tried yet, 1 = initialised by us, 2 = unavailable. Racing first callers may both initialise:
    /// NVML counts `nvmlInit` calls and we never shut down, so that is harmless. An atomic rather than a
    /// `OnceLock`: a fork while another thread initialises must not leave the child waiting for ever.
    state: AtomicU8,
}

impl Nvml {
    /// Wraps the real library's table (`None`: it could not be loaded).
    pub fn new(table: Option<NvmlTable>) -> Nvml {
        Nvml {
            table,
            state: AtomicU8::new(0),
        }
    }

    /// The real functions, whether or not we initialised NVML (for forwarding the program's own calls).
    pub fn table(&self) -> Option<&NvmlTable> {
        self.table.as_ref()
    }

    /// The real functions (a table without any when the library did not load: calls then return
    /// `NVML_ERROR_LIBRARY_NOT_FOUND`).
    pub fn real(&self) -> &NvmlTable {
        static EMPTY: std::sync::OnceLock<NvmlTable> = std::sync::OnceLock::new();
        self.table
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(|| NvmlTable::empty(false)))
    }

    /// The real functions after our own `nvmlInit_v2`, if NVML is available.
    pub fn ready(&self) -> Option<&NvmlTable> {
        let t = self.table.as_ref()?;
        let ready = match self.state.load(Ordering::Acquire) {
            0 => {
                // SAFETY: plain NVML call.
                let r = unsafe { t.nvmlInit_v2() };
                let next = if r.ok() { 1 } else { 2 };
                match self
                    .state
                    .compare_exchange(0, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        if !r.ok() {
                            log!(
                                Level::Info,
                                "NVML unavailable (error {}): overhead is estimated",
                                r.0
                            );
                        }
                        next
                    }
                    Err(first) => first,
                }
            }
            s => s,
        };
        (ready == 1).then_some(t)
    }

    /// NVML's handle for the device with this UUID.
    pub fn handle_by_uuid(&self, uuid: &[u8; 16]) -> Option<nvmlDevice_t> {
        let t = self.ready()?;
        let name = std::ffi::CString::new(cuquota_core::region::layout::format_uuid(uuid)).ok()?;
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: NUL-terminated UUID string, valid out-pointer.
        let r = unsafe { t.nvmlDeviceGetHandleByUUID(name.as_ptr(), &mut handle) };
        (r.ok() && !handle.is_null()).then_some(handle)
    }

    /// The processes NVML lists on the device with this UUID (`nvmlDeviceGetComputeRunningProcesses_v3`).
    pub fn processes(&self, uuid: &[u8; 16]) -> Option<Vec<nvmlProcessInfo_v2_t>> {
        let t = self.ready()?;
        let handle = self.handle_by_uuid(uuid)?;
        // SAFETY: `list` hands a buffer with room for the count it passes.
        list(32, 1 << 16, |n, buf| unsafe {
            t.nvmlDeviceGetComputeRunningProcesses_v3(handle, n, buf)
        })
        .ok()
    }
}

/// Calls an NVML list function with a buffer grown (from `first` records, up to `max`) until the list fits:
/// `call(count in/out, buffer)`. The real function's error otherwise.
pub fn list<T: Copy + Default>(
    first: c_uint,
    max: c_uint,
    mut call: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut cap = first;
    loop {
        let mut buf = vec![T::default(); cap as usize];
        let mut n = cap;
        let r = call(&mut n, buf.as_mut_ptr());
        if r.ok() {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        if r != nvmlReturn_t::ERROR_INSUFFICIENT_SIZE || cap >= max {
            return Err(r);
        }
        cap = (n.max(cap) + 32).min(max);
    }
}
