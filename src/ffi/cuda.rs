//! CUDA driver API types (`cuda.h`, CUDA 13.0).
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use std::ffi::{c_int, c_uint, c_void};

/// `CUresult`: an `enum` in C, passed as a 32-bit integer. Kept as a transparent newtype so that any value the
/// real driver returns (including ones newer than our header) passes through unchanged.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct CUresult(pub c_uint);

impl CUresult {
    pub const SUCCESS: Self = Self(0);
    pub const ERROR_INVALID_VALUE: Self = Self(1);
    pub const ERROR_OUT_OF_MEMORY: Self = Self(2);
    pub const ERROR_NOT_INITIALIZED: Self = Self(3);
    pub const ERROR_DEINITIALIZED: Self = Self(4);
    pub const ERROR_INVALID_DEVICE: Self = Self(101);
    pub const ERROR_INVALID_CONTEXT: Self = Self(201);
    pub const ERROR_INVALID_HANDLE: Self = Self(400);
    pub const ERROR_NOT_FOUND: Self = Self(500);
    pub const ERROR_NOT_SUPPORTED: Self = Self(801);
    pub const ERROR_UNKNOWN: Self = Self(999);

    /// True for `CUDA_SUCCESS`.
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

pub type CUdevice = c_int;
/// `CUdeviceptr` (v2): a 64-bit device address.
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v1`: the 32-bit device address of the pre-3.2 ABI (bare `cuMemAlloc` etc.).
pub type CUdeviceptr_v1 = c_uint;
pub type CUmemGenericAllocationHandle = u64;
pub type cuuint64_t = u64;

pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraphExec = *mut c_void;
/// Opaque struct pointers the shim only forwards.
pub type CUexecAffinityParam = c_void;
pub type CUctxCreateParams = c_void;
pub type CUlaunchConfig = c_void;
pub type CUDA_LAUNCH_PARAMS = c_void;
pub type CUjit_option = c_int;
pub type CUlibraryOption = c_int;
pub type CUarray_format = c_uint;
pub type CUmemPool_attribute = c_int;
pub type CUmemAllocationGranularity_flags = c_int;
pub type CUdriverProcAddressQueryResult = c_int;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (the old ABI of bare `cuArrayCreate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (the old ABI of bare `cuArray3DCreate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Depth: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp.allocFlags`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requestedHandleTypes: c_int,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocFlags,
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub allocType: c_int,
    pub handleTypes: c_int,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: CUmemAllocationGranularity_flags = 0;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: CUmemPool_attribute = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: CUmemPool_attribute = 7;
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
/// `CUgraphMem_attribute` values.
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// Bytes per element of a `CUarray_format` (per channel), for the admission estimate of arrays. Formats whose
/// element size the header does not make obvious (block-compressed, planar video) return a conservative 16.
pub fn array_format_bytes(format: CUarray_format) -> u64 {
    match format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc3 | 0xc9 | 0xc1 | 0xc7 => 2,
        0x03 | 0x0a | 0x20 | 0xc2 | 0xc8 | 0xc4 | 0xca | 0x50 => 4,
        0xc5 | 0xcb => 8,
        _ => 16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_cuda_h() {
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR_v1>(), 16);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR_v1>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY_MEMORY_REQUIREMENTS>(), 32);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, allocFlags), 24);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
    }
}
