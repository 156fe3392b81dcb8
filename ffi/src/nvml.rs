//! NVML types and functions (`nvml.h`, CUDA 13.0), each checked against the header by `header_check`.
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use super::{c_aliases, c_codes, c_consts, c_functions, c_structs};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `nvmlReturn_t`, a transparent newtype so unknown values pass through.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct nvmlReturn_t(pub c_uint);

c_codes! { nvmlReturn_t, checked_results;
    SUCCESS = 0 => "NVML_SUCCESS";
    ERROR_UNINITIALIZED = 1 => "NVML_ERROR_UNINITIALIZED";
    ERROR_INVALID_ARGUMENT = 2 => "NVML_ERROR_INVALID_ARGUMENT";
    ERROR_NOT_SUPPORTED = 3 => "NVML_ERROR_NOT_SUPPORTED";
    ERROR_NO_PERMISSION = 4 => "NVML_ERROR_NO_PERMISSION";
    ERROR_NOT_FOUND = 6 => "NVML_ERROR_NOT_FOUND";
    ERROR_INSUFFICIENT_SIZE = 7 => "NVML_ERROR_INSUFFICIENT_SIZE";
    ERROR_LIBRARY_NOT_FOUND = 12 => "NVML_ERROR_LIBRARY_NOT_FOUND";
    ERROR_FUNCTION_NOT_FOUND = 13 => "NVML_ERROR_FUNCTION_NOT_FOUND";
    ERROR_TIMEOUT = 10 => "NVML_ERROR_TIMEOUT";
    ERROR_GPU_IS_LOST = 15 => "NVML_ERROR_GPU_IS_LOST";
    ERROR_ARGUMENT_VERSION_MISMATCH = 25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    ERROR_UNKNOWN = 999 => "NVML_ERROR_UNKNOWN";
}

impl nvmlReturn_t {
    /// True for `NVML_SUCCESS`.
    #[inline]
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

c_aliases! { checked_aliases;
    pub type nvmlDevice_t = *mut c_void;
    pub type nvmlVgpuInstance_t = c_uint;
    pub type nvmlEnableState_t = c_uint;
    pub type nvmlDeviceArchitecture_t = c_uint;
    pub type nvmlEventSet_t = *mut c_void;
    /// Opaque structs of calls the shim refuses without reading them (vGPU guests' processes).
    pub type nvmlVgpuProcessUtilizationSample_t = c_void;
    pub type nvmlVgpuProcessesUtilizationInfo_t = c_void;
}

/// `nvmlProcessInfo_t` is `nvmlProcessInfo_v2_t` (`_v2` and `_v3` lists).
pub type nvmlProcessInfo_t = nvmlProcessInfo_v2_t;
/// `nvmlProcessDetailList_t` is v1.
pub type nvmlProcessDetailList_t = nvmlProcessDetailList_v1_t;
/// `nvmlProcessesUtilizationInfo_t` is v1.
pub type nvmlProcessesUtilizationInfo_t = nvmlProcessesUtilizationInfo_v1_t;

c_structs! { checked_structs;
    /// `nvmlMemory_t` (v1).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlMemory_t {
        pub total: u64,
        pub free: u64,
        pub used: u64,
    }

    /// `nvmlMemory_v2_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlMemory_v2_t {
        pub version: c_uint,
        pub total: u64,
        pub reserved: u64,
        pub free: u64,
        pub used: u64,
    }

    /// `nvmlProcessInfo_v1_t` (bare `nvmlDeviceGetComputeRunningProcesses`).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlProcessInfo_v1_t {
        pub pid: c_uint,
        pub usedGpuMemory: u64,
    }

    /// `nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t` (`_v2` and `_v3`).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlProcessInfo_v2_t {
        pub pid: c_uint,
        pub usedGpuMemory: u64,
        pub gpuInstanceId: c_uint,
        pub computeInstanceId: c_uint,
    }

    /// `nvmlProcessDetail_v1_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlProcessDetail_v1_t {
        pub pid: c_uint,
        pub usedGpuMemory: u64,
        pub gpuInstanceId: c_uint,
        pub computeInstanceId: c_uint,
        pub usedGpuCcProtectedMemory: u64,
    }

    /// `nvmlProcessDetailList_v1_t` = `nvmlProcessDetailList_t`.
    #[derive(Clone, Copy, Debug)]
    pub struct nvmlProcessDetailList_v1_t {
        pub version: c_uint,
        /// Compute, graphics or MPS compute; passed through as the caller set it.
        pub mode: c_uint,
        pub numProcArrayEntries: c_uint,
        pub procArray: *mut nvmlProcessDetail_v1_t,
    }

    /// `nvmlProcessUtilizationInfo_v1_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlProcessUtilizationInfo_v1_t {
        /// CPU timestamp, µs.
        pub timeStamp: u64,
        pub pid: c_uint,
        pub smUtil: c_uint,
        pub memUtil: c_uint,
        pub encUtil: c_uint,
        pub decUtil: c_uint,
        pub jpgUtil: c_uint,
        pub ofaUtil: c_uint,
    }

    /// `nvmlProcessesUtilizationInfo_v1_t` = `nvmlProcessesUtilizationInfo_t`.
    #[derive(Clone, Copy, Debug)]
    pub struct nvmlProcessesUtilizationInfo_v1_t {
        pub version: c_uint,
        pub processSamplesCount: c_uint,
        pub lastSeenTimeStamp: u64,
        pub procUtilArray: *mut nvmlProcessUtilizationInfo_v1_t,
    }

    /// `nvmlAccountingStats_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlAccountingStats_t {
        pub gpuUtilization: c_uint,
        pub memoryUtilization: c_uint,
        pub maxMemoryUsage: u64,
        pub time: u64,
        pub startTime: u64,
        pub isRunning: c_uint,
        pub reserved: [c_uint; 5],
    }

    /// `nvmlProcessUtilizationSample_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlEncoderSessionInfo_t {
        pub sessionId: c_uint,
        pub pid: c_uint,
        pub vgpuInstance: nvmlVgpuInstance_t,
        pub codecType: c_uint,
        pub hResolution: c_uint,
        pub vResolution: c_uint,
        pub averageFps: c_uint,
        pub averageLatency: c_uint,
    }

    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlFBCSessionInfo_t {
        pub sessionId: c_uint,
        pub pid: c_uint,
        pub vgpuInstance: nvmlVgpuInstance_t,
        pub displayOrdinal: c_uint,
        pub sessionType: c_uint,
        pub sessionFlags: c_uint,
        pub hMaxResolution: c_uint,
        pub vMaxResolution: c_uint,
        pub hResolution: c_uint,
        pub vResolution: c_uint,
        pub averageFPS: c_uint,
        pub averageLatency: c_uint,
    }

    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlProcessUtilizationSample_t {
        pub pid: c_uint,
        /// CPU timestamp, µs.
        pub timeStamp: u64,
        pub smUtil: c_uint,
        pub memUtil: c_uint,
        pub encUtil: c_uint,
        pub decUtil: c_uint,
    }

    /// `nvmlEventData_t` (`nvmlEventSetWait_v2`).
    #[derive(Clone, Copy, Debug)]
    pub struct nvmlEventData_t {
        pub device: nvmlDevice_t,
        pub eventType: u64,
        pub eventData: u64,
        pub gpuInstanceId: c_uint,
        pub computeInstanceId: c_uint,
    }

    /// `nvmlPciInfo_t` (`nvmlDeviceGetPciInfo_v3`).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlPciInfo_t {
        pub busIdLegacy: [c_char; 16],
        pub domain: c_uint,
        pub bus: c_uint,
        pub device: c_uint,
        pub pciDeviceId: c_uint,
        pub pciSubSystemId: c_uint,
        pub busId: [c_char; 32],
    }

    /// `nvmlUtilization_t`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct nvmlUtilization_t {
        pub gpu: c_uint,
        pub memory: c_uint,
    }
}

c_consts! { checked_consts;
    /// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = sizeof | 2 << 24.
    NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24) => "nvmlMemory_v2";
    /// `nvmlProcessesUtilizationInfo_v1` = `NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1)`.
    NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint = (std::mem::size_of::<nvmlProcessesUtilizationInfo_v1_t>() as c_uint) | (1 << 24) => "nvmlProcessesUtilizationInfo_v1";
    /// `nvmlProcessDetailList_v1` = `NVML_STRUCT_VERSION(ProcessDetailList, 1)`.
    NVML_PROCESS_DETAIL_LIST_V1: c_uint = (std::mem::size_of::<nvmlProcessDetailList_v1_t>() as c_uint) | (1 << 24) => "nvmlProcessDetailList_v1";
    /// `nvmlEventTypeXidCriticalError`.
    NVML_EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8 => "nvmlEventTypeXidCriticalError";
    /// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
    NVML_DEVICE_UUID_BUFFER_SIZE: usize = 96 => "NVML_DEVICE_UUID_V2_BUFFER_SIZE";
}

c_functions! {
    /// Real NVML entry points, one line per function cuquota calls or exports (the line format is
    /// `cuda::CudaTable`'s, without versions: NVML versions its names, `_v2`, `_v3`). The bare and `_v2` process
    /// lists (compute, graphics, MPS) are declared in `nvml.h`'s `NVML_NO_UNVERSIONED_FUNC_DEFS` section.
    NvmlTable -> nvmlReturn_t, checked_functions;
    missing_library = nvmlReturn_t::ERROR_LIBRARY_NOT_FOUND, missing_symbol = nvmlReturn_t::ERROR_FUNCTION_NOT_FOUND;
    // initialisation
    nvmlInit ();
    nvmlInit_v2 ();
    nvmlInitWithFlags (flags: c_uint);
    nvmlShutdown ();
    // devices, memory and processes
    nvmlDeviceGetMemoryInfo (device: nvmlDevice_t, memory: *mut nvmlMemory_t);
    nvmlDeviceGetMemoryInfo_v2 (device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t);
    nvmlDeviceGetComputeRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
    nvmlDeviceGetComputeRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t);
    nvmlDeviceGetComputeRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t);
    nvmlDeviceGetGraphicsRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
    nvmlDeviceGetGraphicsRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t);
    nvmlDeviceGetGraphicsRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t);
    nvmlDeviceGetMPSComputeRunningProcesses (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
    nvmlDeviceGetMPSComputeRunningProcesses_v2 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t);
    nvmlDeviceGetMPSComputeRunningProcesses_v3 (device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t);
    nvmlDeviceGetRunningProcessDetailList (device: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t);
    nvmlDeviceGetProcessesUtilizationInfo (device: nvmlDevice_t, procesesUtilInfo: *mut nvmlProcessesUtilizationInfo_t);
    nvmlSystemGetProcessName (pid: c_uint, name: *mut c_char, length: c_uint);
    nvmlDeviceGetAccountingPids (device: nvmlDevice_t, count: *mut c_uint, pids: *mut c_uint);
    nvmlDeviceGetAccountingStats (device: nvmlDevice_t, pid: c_uint, stats: *mut nvmlAccountingStats_t);
    nvmlDeviceGetProcessUtilization (device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t, processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64);
    nvmlDeviceGetEncoderSessions (device: nvmlDevice_t, sessionCount: *mut c_uint, sessionInfos: *mut nvmlEncoderSessionInfo_t);
    nvmlDeviceGetFBCSessions (device: nvmlDevice_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlFBCSessionInfo_t);
    // accounting and vGPU (the preload library refuses them)
    nvmlDeviceClearAccountingPids (device: nvmlDevice_t);
    nvmlDeviceSetAccountingMode (device: nvmlDevice_t, mode: nvmlEnableState_t);
    nvmlVgpuInstanceGetEncoderSessions (vgpuInstance: nvmlVgpuInstance_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlEncoderSessionInfo_t);
    nvmlVgpuInstanceGetFBCSessions (vgpuInstance: nvmlVgpuInstance_t, sessionCount: *mut c_uint, sessionInfo: *mut nvmlFBCSessionInfo_t);
    nvmlVgpuInstanceGetAccountingPids (vgpuInstance: nvmlVgpuInstance_t, count: *mut c_uint, pids: *mut c_uint);
    nvmlVgpuInstanceGetAccountingStats (vgpuInstance: nvmlVgpuInstance_t, pid: c_uint, stats: *mut nvmlAccountingStats_t);
    nvmlVgpuInstanceClearAccountingPids (vgpuInstance: nvmlVgpuInstance_t);
    nvmlDeviceGetVgpuProcessUtilization (device: nvmlDevice_t, lastSeenTimeStamp: u64, vgpuProcessSamplesCount: *mut c_uint, utilizationSamples: *mut nvmlVgpuProcessUtilizationSample_t);
    nvmlDeviceGetVgpuProcessesUtilizationInfo (device: nvmlDevice_t, vgpuProcUtilInfo: *mut nvmlVgpuProcessesUtilizationInfo_t);
    // device lookup
    nvmlDeviceGetCount_v2 (deviceCount: *mut c_uint);
    nvmlDeviceGetHandleByIndex_v2 (index: c_uint, device: *mut nvmlDevice_t);
    nvmlDeviceGetHandleByUUID (uuid: *const c_char, device: *mut nvmlDevice_t);
    nvmlDeviceGetUUID (device: nvmlDevice_t, uuid: *mut c_char, length: c_uint);
    nvmlDeviceGetIndex (device: nvmlDevice_t, index: *mut c_uint);
    nvmlDeviceGetUtilizationRates (device: nvmlDevice_t, utilization: *mut nvmlUtilization_t);
    // what the DRA plugin publishes as device attributes
    nvmlDeviceGetName (device: nvmlDevice_t, name: *mut c_char, length: c_uint);
    nvmlDeviceGetArchitecture (device: nvmlDevice_t, arch: *mut nvmlDeviceArchitecture_t);
    nvmlDeviceGetCudaComputeCapability (device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int);
    nvmlDeviceGetPciInfo_v3 (device: nvmlDevice_t, pci: *mut nvmlPciInfo_t);
    nvmlSystemGetDriverVersion (version: *mut c_char, length: c_uint);
    // XID errors, for the DRA plugin's device health
    nvmlEventSetCreate (set: *mut nvmlEventSet_t);
    nvmlDeviceRegisterEvents (device: nvmlDevice_t, eventTypes: u64, set: nvmlEventSet_t);
    nvmlEventSetWait_v2 (set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint);
    nvmlEventSetFree (set: nvmlEventSet_t);
}

/// `nvmlErrorString`, the one NVML function cuquota calls that returns no `nvmlReturn_t`: a static string.
pub type PFN_nvmlErrorString = unsafe extern "C" fn(result: nvmlReturn_t) -> *const c_char;

/// `PFN_nvmlErrorString` as the header check reads it: (name, return type, argument types).
#[cfg(test)]
pub const OTHER_SIGNATURES: &[(&str, &str, &[&str])] =
    &[("nvmlErrorString", "*const c_char", &["nvmlReturn_t"])];

/// Process-info records share `pid` and `usedGpuMemory`; the list filter is generic over the record version.
pub trait ProcessInfo: Copy + Default {
    fn pid(&self) -> c_uint;
    fn used(&self) -> u64;
}
impl ProcessInfo for nvmlProcessInfo_v1_t {
    fn pid(&self) -> c_uint {
        self.pid
    }
    fn used(&self) -> u64 {
        self.usedGpuMemory
    }
}
impl ProcessInfo for nvmlProcessInfo_v2_t {
    fn pid(&self) -> c_uint {
        self.pid
    }
    fn used(&self) -> u64 {
        self.usedGpuMemory
    }
}

/// Memory-info records (v1, v2) share `total`, `used`, `free`; the hook is generic over the version.
pub trait MemoryInfo {
    /// `(total, used, free)`, to rewrite in place.
    fn fields(&mut self) -> (&mut u64, &mut u64, &mut u64);
}
impl MemoryInfo for nvmlMemory_t {
    fn fields(&mut self) -> (&mut u64, &mut u64, &mut u64) {
        (&mut self.total, &mut self.used, &mut self.free)
    }
}
impl MemoryInfo for nvmlMemory_v2_t {
    fn fields(&mut self) -> (&mut u64, &mut u64, &mut u64) {
        (&mut self.total, &mut self.used, &mut self.free)
    }
}

/// A session record of `nvmlDeviceGetEncoderSessions` / `nvmlDeviceGetFBCSessions`: its owner's pid.
pub trait SessionInfo: Copy + Default {
    fn pid(&self) -> c_uint;
}
impl SessionInfo for nvmlEncoderSessionInfo_t {
    fn pid(&self) -> c_uint {
        self.pid
    }
}
impl SessionInfo for nvmlFBCSessionInfo_t {
    fn pid(&self) -> c_uint {
        self.pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(NVML_MEMORY_V2, 40 | (2 << 24));
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_v2_t>(), 24);
    }
}
