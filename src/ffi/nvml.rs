//! NVML types (`nvml.h`, CUDA 13.0).
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use std::ffi::{c_uint, c_void};

/// `nvmlReturn_t`, a transparent newtype so unknown values pass through.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct nvmlReturn_t(pub c_uint);

impl nvmlReturn_t {
    pub const SUCCESS: Self = Self(0);
    pub const ERROR_UNINITIALIZED: Self = Self(1);
    pub const ERROR_INVALID_ARGUMENT: Self = Self(2);
    pub const ERROR_NOT_SUPPORTED: Self = Self(3);
    pub const ERROR_NOT_FOUND: Self = Self(6);
    pub const ERROR_INSUFFICIENT_SIZE: Self = Self(7);
    pub const ERROR_LIBRARY_NOT_FOUND: Self = Self(12);
    pub const ERROR_FUNCTION_NOT_FOUND: Self = Self(13);
    pub const ERROR_ARGUMENT_VERSION_MISMATCH: Self = Self(25);
    pub const ERROR_UNKNOWN: Self = Self(999);

    /// True for `NVML_SUCCESS`.
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

pub type nvmlDevice_t = *mut c_void;

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = sizeof | 2 << 24.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_v1_t` (bare `nvmlDeviceGetComputeRunningProcesses`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t` (`_v2` and `_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
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

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 96;

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
