//! The NVML functions the shim touches: the hooked ones (exported by `abi::nvml`) and helpers. Signatures from
//! `nvml.h` (CUDA 13.0); the bare `nvmlDeviceGetComputeRunningProcesses` and `_v2` are declared in its
//! `NVML_NO_UNVERSIONED_FUNC_DEFS` section.

#![allow(non_snake_case)]

use crate::ffi::nvml::*;
use std::ffi::{c_char, c_uint};

/// Invokes `$cb! { [ hooked list ] }` with every exported (hooked) NVML function.
macro_rules! nvml_hooked {
    ($cb:ident) => {
        $cb! { [
            nvmlInit();
            nvmlInit_v2();
            nvmlInitWithFlags(flags: c_uint);
            nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t);
            nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t);
            nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint,
                infos: *mut nvmlProcessInfo_v1_t);
            nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint,
                infos: *mut nvmlProcessInfo_v2_t);
            nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint,
                infos: *mut nvmlProcessInfo_v2_t);
        ] }
    };
}
pub(crate) use nvml_hooked;

macro_rules! nvml_table {
    ( [ $( $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )* ] ) => {
        crate::driver::function_table! {
            /// Real NVML entry points.
            NvmlTable -> nvmlReturn_t;
            missing_library = nvmlReturn_t::ERROR_LIBRARY_NOT_FOUND,
            missing_symbol = nvmlReturn_t::ERROR_FUNCTION_NOT_FOUND;
            [
                $( $name ( $( $arg : $ty ),* ); )*
                nvmlDeviceGetCount_v2(deviceCount: *mut c_uint);
                nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t);
                nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t);
                nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint);
                nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint);
                nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t,
                    processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64);
            ]
        }
    };
}
nvml_hooked!(nvml_table);
