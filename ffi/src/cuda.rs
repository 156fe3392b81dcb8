//! CUDA driver API types (`cuda.h`, CUDA 13.0), each checked against the header by `header_check`.
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use super::{c_aliases, c_codes, c_consts, c_functions, c_structs};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult`: an `enum` in C, passed as a 32-bit integer. Kept as a transparent newtype so that any value the
/// real driver returns (including ones newer than our header) passes through unchanged.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct CUresult(pub c_uint);

c_codes! { CUresult, checked_results;
    SUCCESS = 0 => "CUDA_SUCCESS";
    ERROR_INVALID_VALUE = 1 => "CUDA_ERROR_INVALID_VALUE";
    ERROR_OUT_OF_MEMORY = 2 => "CUDA_ERROR_OUT_OF_MEMORY";
    ERROR_NOT_INITIALIZED = 3 => "CUDA_ERROR_NOT_INITIALIZED";
    ERROR_DEINITIALIZED = 4 => "CUDA_ERROR_DEINITIALIZED";
    ERROR_INVALID_DEVICE = 101 => "CUDA_ERROR_INVALID_DEVICE";
    ERROR_INVALID_IMAGE = 200 => "CUDA_ERROR_INVALID_IMAGE";
    ERROR_INVALID_CONTEXT = 201 => "CUDA_ERROR_INVALID_CONTEXT";
    ERROR_FILE_NOT_FOUND = 301 => "CUDA_ERROR_FILE_NOT_FOUND";
    ERROR_INVALID_HANDLE = 400 => "CUDA_ERROR_INVALID_HANDLE";
    ERROR_NOT_FOUND = 500 => "CUDA_ERROR_NOT_FOUND";
    ERROR_NOT_READY = 600 => "CUDA_ERROR_NOT_READY";
    ERROR_NOT_SUPPORTED = 801 => "CUDA_ERROR_NOT_SUPPORTED";
    ERROR_UNKNOWN = 999 => "CUDA_ERROR_UNKNOWN";
}

impl CUresult {
    /// True for `CUDA_SUCCESS`.
    #[inline]
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

c_aliases! { checked_aliases;
    pub type CUdevice = c_int;
    /// `CUdeviceptr` (v2): a 64-bit device address.
    pub type CUdeviceptr = u64;
    /// `CUdeviceptr_v1`: the 32-bit device address of the pre-3.2 ABI (bare `cuMemAlloc` etc.).
    pub type CUdeviceptr_v1 = c_uint;
    pub type CUmemGenericAllocationHandle = u64;
    pub type cuuint32_t = u32;
    pub type cuuint64_t = u64;
    pub type CUcontext = *mut c_void;
    pub type CUmodule = *mut c_void;
    pub type CUlibrary = *mut c_void;
    pub type CUtexref = *mut c_void;
    pub type CUsurfref = *mut c_void;
    pub type CUfunction = *mut c_void;
    pub type CUkernel = *mut c_void;
    pub type CUstream = *mut c_void;
    pub type CUevent = *mut c_void;
    pub type CUarray = *mut c_void;
    pub type CUmipmappedArray = *mut c_void;
    pub type CUmemoryPool = *mut c_void;
    pub type CUgraph = *mut c_void;
    pub type CUgraphNode = *mut c_void;
    pub type CUgraphExec = *mut c_void;
    /// Opaque structs the shim only forwards pointers to.
    pub type CUexecAffinityParam = c_void;
    pub type CUctxCreateParams = c_void;
    pub type CUgraphExecUpdateResultInfo = c_void;
    pub type CUgraphNodeParams = c_void;
    pub type CUgraphEdgeData = c_void;
    pub type CUmulticastObjectProp = c_void;
    pub type CUmemcpyAttributes = c_void;
    pub type CUDA_MEMCPY3D_BATCH_OP = c_void;
    pub type CUstreamBatchMemOpParams = c_void;
    /// C enums (none has a negative value, so the ABI's type is `unsigned int`).
    pub type CUjit_option = c_uint;
    pub type CUlibraryOption = c_uint;
    pub type CUarray_format = c_uint;
    pub type CUmemPool_attribute = c_uint;
    pub type CUmemAllocationGranularity_flags = c_uint;
    pub type CUdriverProcAddressQueryResult = c_uint;
    pub type CUgraphMem_attribute = c_uint;
    pub type CUgraphNodeType = c_uint;
    pub type CUgraphExecUpdateResult = c_uint;
    pub type CUlimit = c_uint;
    pub type CUmemorytype = c_uint;
    pub type CUstreamCaptureStatus = c_uint;
    pub type CUdevice_attribute = c_uint;
    pub type CUpointer_attribute = c_uint;
    pub type CUfunction_attribute = c_uint;
    pub type CUmemAllocationHandleType = c_uint;
}

c_structs! { checked_structs;
    /// `CUuuid`.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
    pub struct CUuuid {
        pub bytes: [u8; 16],
    }

    /// `CUDA_ARRAY_DESCRIPTOR` (v2).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_ARRAY_DESCRIPTOR {
        pub Width: usize,
        pub Height: usize,
        pub Format: CUarray_format,
        pub NumChannels: c_uint,
    }

    /// `CUDA_ARRAY_DESCRIPTOR_v1` (the old ABI of bare `cuArrayCreate`).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
        pub Width: c_uint,
        pub Height: c_uint,
        pub Format: CUarray_format,
        pub NumChannels: c_uint,
    }

    /// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
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
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
        pub size: usize,
        pub alignment: usize,
        pub reserved: [c_uint; 4],
    }

    /// `CUmemLocation`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CUmemLocation {
        pub type_ as "type": c_int,
        pub id: c_int,
    }

    /// `CUmemAccessDesc` (`_v1`).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CUmemAccessDesc {
        pub location: CUmemLocation,
        pub flags: c_int,
    }

    /// `CUmemAllocationProp.allocFlags` (an anonymous struct in C).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CUmemAllocFlags as "__typeof__(((CUmemAllocationProp *)0)->allocFlags)" {
        pub compressionType: u8,
        pub gpuDirectRDMACapable: u8,
        pub usage: u16,
        pub reserved: [u8; 4],
    }

    /// `CUipcMemHandle` (passed by value).
    #[derive(Clone, Copy, Debug)]
    pub struct CUipcMemHandle {
        pub reserved: [u8; 64],
    }

    /// `CUmemPoolPtrExportData`: what names an exported pool allocation to another process.
    #[derive(Clone, Copy, Debug)]
    pub struct CUmemPoolPtrExportData {
        pub reserved: [u8; 64],
    }

    /// `CUmemFabricHandle`: a `CU_MEM_HANDLE_TYPE_FABRIC` shareable handle.
    #[derive(Clone, Copy, Debug)]
    pub struct CUmemFabricHandle {
        pub data: [u8; 64],
    }

    /// `CUmemAllocationProp`.
    #[derive(Clone, Copy, Debug)]
    pub struct CUmemAllocationProp {
        pub type_ as "type": c_int,
        pub requestedHandleTypes: c_int,
        pub location: CUmemLocation,
        pub win32HandleMetaData: *mut c_void,
        pub allocFlags: CUmemAllocFlags,
    }

    /// `CUmemPoolProps`.
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

    /// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
        pub poolProps: CUmemPoolProps,
        pub accessDescs: *const c_void,
        pub accessDescCount: usize,
        pub bytesize: usize,
        pub dptr: CUdeviceptr,
    }

    /// `CUarrayMapInfo` (`cuMemMapArrayAsync`); the unions as their largest member's words.
    #[derive(Clone, Copy, Debug)]
    pub struct CUarrayMapInfo {
        pub resourceType: c_uint,
        pub resource: *mut c_void,
        pub subresourceType: c_uint,
        pub subresource: [u64; 4],
        pub memOperationType: c_uint,
        pub memHandleType: c_uint,
        pub memHandle: CUmemGenericAllocationHandle,
        pub offset: u64,
        pub deviceBitMask: c_uint,
        pub flags: c_uint,
        pub reserved: [c_uint; 2],
    }

    /// `CUlaunchConfig` (`cuLaunchKernelEx`).
    #[derive(Clone, Copy, Debug)]
    pub struct CUlaunchConfig {
        pub gridDimX: c_uint,
        pub gridDimY: c_uint,
        pub gridDimZ: c_uint,
        pub blockDimX: c_uint,
        pub blockDimY: c_uint,
        pub blockDimZ: c_uint,
        pub sharedMemBytes: c_uint,
        pub hStream: CUstream,
        pub attrs: *mut c_void,
        pub numAttrs: c_uint,
    }

    /// `CUDA_LAUNCH_PARAMS` (`cuLaunchCooperativeKernelMultiDevice`).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_LAUNCH_PARAMS {
        pub function: CUfunction,
        pub gridDimX: c_uint,
        pub gridDimY: c_uint,
        pub gridDimZ: c_uint,
        pub blockDimX: c_uint,
        pub blockDimY: c_uint,
        pub blockDimZ: c_uint,
        pub sharedMemBytes: c_uint,
        pub hStream: CUstream,
        pub kernelParams: *mut *mut c_void,
    }

    /// `CUDA_GRAPH_INSTANTIATE_PARAMS`: the instantiate hook reads the flags and the upload stream.
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
        pub flags: cuuint64_t,
        pub hUploadStream: CUstream,
        pub hErrNode_out: CUgraphNode,
        pub result_out: c_uint,
    }

    /// `CUDA_KERNEL_NODE_PARAMS` (v2; `CUgraphNodeParams`' `kernel` member, v3, has its layout): the graph
    /// hooks read the kernel a node runs (`kern` when `func` is NULL).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_KERNEL_NODE_PARAMS {
        pub func: CUfunction,
        pub gridDimX: c_uint,
        pub gridDimY: c_uint,
        pub gridDimZ: c_uint,
        pub blockDimX: c_uint,
        pub blockDimY: c_uint,
        pub blockDimZ: c_uint,
        pub sharedMemBytes: c_uint,
        pub kernelParams: *mut *mut c_void,
        pub extra: *mut *mut c_void,
        pub kern: CUkernel,
        pub ctx: CUcontext,
    }

    /// `CUDA_KERNEL_NODE_PARAMS_v1` (the bare `cuGraph*KernelNode*Params` forms): the v2 struct without `kern`
    /// and `ctx`.
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_KERNEL_NODE_PARAMS_v1 {
        pub func: CUfunction,
        pub gridDimX: c_uint,
        pub gridDimY: c_uint,
        pub gridDimZ: c_uint,
        pub blockDimX: c_uint,
        pub blockDimY: c_uint,
        pub blockDimZ: c_uint,
        pub sharedMemBytes: c_uint,
        pub kernelParams: *mut *mut c_void,
        pub extra: *mut *mut c_void,
    }

    /// `CUDA_MEMCPY2D` (v2): the copy hooks read its extent.
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_MEMCPY2D {
        pub srcXInBytes: usize,
        pub srcY: usize,
        pub srcMemoryType: CUmemorytype,
        pub srcHost: *const c_void,
        pub srcDevice: CUdeviceptr,
        pub srcArray: CUarray,
        pub srcPitch: usize,
        pub dstXInBytes: usize,
        pub dstY: usize,
        pub dstMemoryType: CUmemorytype,
        pub dstHost: *mut c_void,
        pub dstDevice: CUdeviceptr,
        pub dstArray: CUarray,
        pub dstPitch: usize,
        pub WidthInBytes: usize,
        pub Height: usize,
    }

    /// `CUDA_MEMCPY3D` (v2).
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_MEMCPY3D {
        pub srcXInBytes: usize,
        pub srcY: usize,
        pub srcZ: usize,
        pub srcLOD: usize,
        pub srcMemoryType: CUmemorytype,
        pub srcHost: *const c_void,
        pub srcDevice: CUdeviceptr,
        pub srcArray: CUarray,
        pub reserved0: *mut c_void,
        pub srcPitch: usize,
        pub srcHeight: usize,
        pub dstXInBytes: usize,
        pub dstY: usize,
        pub dstZ: usize,
        pub dstLOD: usize,
        pub dstMemoryType: CUmemorytype,
        pub dstHost: *mut c_void,
        pub dstDevice: CUdeviceptr,
        pub dstArray: CUarray,
        pub reserved1: *mut c_void,
        pub dstPitch: usize,
        pub dstHeight: usize,
        pub WidthInBytes: usize,
        pub Height: usize,
        pub Depth: usize,
    }

    /// `CUDA_MEMCPY3D_PEER`.
    #[derive(Clone, Copy, Debug)]
    pub struct CUDA_MEMCPY3D_PEER {
        pub srcXInBytes: usize,
        pub srcY: usize,
        pub srcZ: usize,
        pub srcLOD: usize,
        pub srcMemoryType: CUmemorytype,
        pub srcHost: *const c_void,
        pub srcDevice: CUdeviceptr,
        pub srcArray: CUarray,
        pub srcContext: CUcontext,
        pub srcPitch: usize,
        pub srcHeight: usize,
        pub dstXInBytes: usize,
        pub dstY: usize,
        pub dstZ: usize,
        pub dstLOD: usize,
        pub dstMemoryType: CUmemorytype,
        pub dstHost: *mut c_void,
        pub dstDevice: CUdeviceptr,
        pub dstArray: CUarray,
        pub dstContext: CUcontext,
        pub dstPitch: usize,
        pub dstHeight: usize,
        pub WidthInBytes: usize,
        pub Height: usize,
        pub Depth: usize,
    }
}

c_consts! { checked_consts;
    CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
    CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
    CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
    CU_STREAM_NON_BLOCKING: c_uint = 0x1;
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 0x1;
    CU_MEM_HANDLE_TYPE_FABRIC: CUmemAllocationHandleType = 0x8;
    CU_MEM_ALLOC_GRANULARITY_MINIMUM: CUmemAllocationGranularity_flags = 0;
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: CUmemPool_attribute = 5;
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT: CUmemPool_attribute = 7;
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: CUgraphMem_attribute = 0;
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: CUgraphMem_attribute = 2;
    CU_GRAPH_NODE_TYPE_KERNEL: CUgraphNodeType = 0;
    CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: cuuint64_t = 2;
    CUDA_GRAPH_INSTANTIATE_ERROR: c_uint = 1;
    CU_GRAPH_NODE_TYPE_GRAPH: CUgraphNodeType = 4;
    CU_GRAPH_NODE_TYPE_CONDITIONAL: CUgraphNodeType = 13;
    CU_MEM_OPERATION_TYPE_MAP: c_uint = 1;
    CU_MEM_OPERATION_TYPE_UNMAP: c_uint = 2;
    CU_GRAPH_NODE_TYPE_MEM_ALLOC: CUgraphNodeType = 10;
    CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
    /// Event flags: `cuEventSynchronize` sleeps instead of spinning; no timestamps (cheaper).
    CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;
    CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
    CU_LIMIT_STACK_SIZE: CUlimit = 0x00;
    CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
    CU_LIMIT_PRINTF_FIFO_SIZE: CUlimit = 0x01;
    CU_LIMIT_MALLOC_HEAP_SIZE: CUlimit = 0x02;
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: CUlimit = 0x04;
    CU_LIMIT_MAX_L2_FETCH_GRANULARITY: CUlimit = 0x05;
    CU_LIMIT_PERSISTING_L2_CACHE_SIZE: CUlimit = 0x06;
    CU_LIMIT_SHMEM_SIZE: CUlimit = 0x07;
    CU_LIMIT_CIG_ENABLED: CUlimit = 0x08;
    CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: CUlimit = 0x09;
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: CUpointer_attribute = 9;
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUpointer_attribute = 11;
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: CUfunction_attribute = 3;
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: CUdevice_attribute = 16;
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: CUdevice_attribute = 39;
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: CUdevice_attribute = 75;
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: CUdevice_attribute = 76;
    /// `CU_STREAM_LEGACY`: the legacy default stream's handle.
    CU_STREAM_LEGACY: usize = 0x1;
    /// `CU_STREAM_PER_THREAD`: the per-thread default stream's handle.
    CU_STREAM_PER_THREAD: usize = 0x2;
    /// Array flags: memory comes later through VMM mappings (charged at `cuMemCreate`).
    CUDA_ARRAY3D_SPARSE: c_uint = 0x40;
    CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;
    CU_AD_FORMAT_UNSIGNED_INT8: CUarray_format = 0x01;
    CU_AD_FORMAT_UNSIGNED_INT16: CUarray_format = 0x02;
    CU_AD_FORMAT_UNSIGNED_INT32: CUarray_format = 0x03;
    CU_AD_FORMAT_SIGNED_INT8: CUarray_format = 0x08;
    CU_AD_FORMAT_SIGNED_INT16: CUarray_format = 0x09;
    CU_AD_FORMAT_SIGNED_INT32: CUarray_format = 0x0a;
    CU_AD_FORMAT_HALF: CUarray_format = 0x10;
    CU_AD_FORMAT_FLOAT: CUarray_format = 0x20;
    CU_AD_FORMAT_UNORM_INT_101010_2: CUarray_format = 0x50;
    CU_AD_FORMAT_UNORM_INT8X1: CUarray_format = 0xc0;
    CU_AD_FORMAT_UNORM_INT8X2: CUarray_format = 0xc1;
    CU_AD_FORMAT_UNORM_INT8X4: CUarray_format = 0xc2;
    CU_AD_FORMAT_UNORM_INT16X1: CUarray_format = 0xc3;
    CU_AD_FORMAT_UNORM_INT16X2: CUarray_format = 0xc4;
    CU_AD_FORMAT_UNORM_INT16X4: CUarray_format = 0xc5;
    CU_AD_FORMAT_SNORM_INT8X1: CUarray_format = 0xc6;
    CU_AD_FORMAT_SNORM_INT8X2: CUarray_format = 0xc7;
    CU_AD_FORMAT_SNORM_INT8X4: CUarray_format = 0xc8;
    CU_AD_FORMAT_SNORM_INT16X1: CUarray_format = 0xc9;
    CU_AD_FORMAT_SNORM_INT16X2: CUarray_format = 0xca;
    CU_AD_FORMAT_SNORM_INT16X4: CUarray_format = 0xcb;
}

c_functions! {
    /// Real CUDA driver entry points, one line per function cuquota calls or exports: `name @version (args);`,
    /// `version` the CUDA version of that ABI, as in `cudaTypedefs.h`'s `PFN_<name>_v<version>[_ptsz]` (the
    /// header check compares the signature with that typedef). The `_v2`, `_v3`, `_ptsz` and bare forms of a call
    /// are separate lines; the bare names use the old 32-bit ABI that `cuda.h` declares under
    /// `__CUDA_API_VERSION_INTERNAL`.
    CudaTable -> CUresult, checked_functions;
    missing_library = CUresult::ERROR_NOT_INITIALIZED, missing_symbol = CUresult::ERROR_NOT_FOUND;
    // initialisation and symbol lookup
    cuInit @2000 (Flags: c_uint);
    cuGetProcAddress @11030 (symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t);
    cuGetProcAddress_v2 @12000 (symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult);
    // linear allocations
    cuMemAlloc_v2 @3020 (dptr: *mut CUdeviceptr, bytesize: usize);
    cuMemAlloc @2000 (dptr: *mut CUdeviceptr_v1, bytesize: c_uint);
    cuMemAllocManaged @6000 (dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
    cuMemAllocPitch_v2 @3020 (dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint);
    cuMemAllocPitch @2000 (dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint);
    cuMemFree_v2 @3020 (dptr: CUdeviceptr);
    cuMemFree @2000 (dptr: CUdeviceptr_v1);
    // stream-ordered allocator
    cuMemAllocAsync @11020 (dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
    cuMemAllocAsync_ptsz @11020 (dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
    cuMemAllocFromPoolAsync @11020 (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
    cuMemAllocFromPoolAsync_ptsz @11020 (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
    cuMemFreeAsync @11020 (dptr: CUdeviceptr, hStream: CUstream);
    cuMemFreeAsync_ptsz @11020 (dptr: CUdeviceptr, hStream: CUstream);
    cuMemPoolCreate @11020 (pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps);
    cuMemPoolTrimTo @11020 (pool: CUmemoryPool, minBytesToKeep: usize);
    cuMemPoolDestroy @11020 (pool: CUmemoryPool);
    cuCtxSynchronize @2000 ();
    cuCtxSynchronize_v2 @13000 (ctx: CUcontext);
    cuStreamSynchronize @2000 (hStream: CUstream);
    cuStreamSynchronize_ptsz @7000 (hStream: CUstream);
    cuMemPoolExportPointer @11020 (shareData_out: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr);
    cuMemPoolImportPointer @11020 (ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, shareData: *mut CUmemPoolPtrExportData);
    // virtual memory management
    cuMemCreate @10020 (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64);
    cuMemRelease @10020 (handle: CUmemGenericAllocationHandle);
    cuMemMap @10020 (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64);
    cuMemUnmap @10020 (ptr: CUdeviceptr, size: usize);
    cuMemAddressReserve @10020 (ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64);
    cuMemAddressFree @10020 (ptr: CUdeviceptr, size: usize);
    cuMemSetAccess @10020 (ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    cuStreamCreate @2000 (phStream: *mut CUstream, Flags: c_uint);
    cuStreamQuery @2000 (hStream: CUstream);
    cuMemMapArrayAsync @11010 (mapInfoList: *mut CUarrayMapInfo, count: c_uint, hStream: CUstream);
    cuMemMapArrayAsync_ptsz @11010 (mapInfoList: *mut CUarrayMapInfo, count: c_uint, hStream: CUstream);
    cuMulticastCreate @12010 (mcHandle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp);
    cuMulticastBindMem @12010 (mcHandle: CUmemGenericAllocationHandle, mcOffset: usize, memHandle: CUmemGenericAllocationHandle, memOffset: usize, size: usize, flags: u64);
    cuMulticastBindAddr @12010 (mcHandle: CUmemGenericAllocationHandle, mcOffset: usize, memptr: CUdeviceptr, size: usize, flags: u64);
    cuMulticastUnbind @12010 (mcHandle: CUmemGenericAllocationHandle, dev: CUdevice, mcOffset: usize, size: usize);
    cuMemRetainAllocationHandle @11000 (handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void);
    cuMemExportToShareableHandle @10020 (shareableHandle: *mut c_void, handle: CUmemGenericAllocationHandle, handleType: CUmemAllocationHandleType, flags: u64);
    cuMemImportFromShareableHandle @10020 (handle: *mut CUmemGenericAllocationHandle, osHandle: *mut c_void, shHandleType: CUmemAllocationHandleType);
    // interprocess memory
    cuIpcGetMemHandle @4010 (pHandle: *mut CUipcMemHandle, dptr: CUdeviceptr);
    cuIpcOpenMemHandle_v2 @11000 (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint);
    cuIpcOpenMemHandle @4010 (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint);
    cuIpcCloseMemHandle @4010 (dptr: CUdeviceptr);
    // arrays
    cuArrayCreate_v2 @3020 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR);
    cuArrayCreate @2000 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1);
    cuArray3DCreate_v2 @3020 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR);
    cuArray3DCreate @2000 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1);
    cuMipmappedArrayCreate @5000 (pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint);
    cuArrayDestroy @2000 (hArray: CUarray);
    cuMipmappedArrayDestroy @5000 (hMipmappedArray: CUmipmappedArray);
    // what the program is told about memory
    cuMemGetInfo_v2 @3020 (free: *mut usize, total: *mut usize);
    cuMemGetInfo @2000 (free: *mut c_uint, total: *mut c_uint);
    cuDeviceTotalMem_v2 @3020 (bytes: *mut usize, dev: CUdevice);
    cuDeviceTotalMem @2000 (bytes: *mut c_uint, dev: CUdevice);
    // contexts and modules (overhead measurement)
    cuCtxCreate @2000 (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    cuCtxCreate_v2 @3020 (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    cuCtxCreate_v3 @11040 (pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice);
    cuCtxCreate_v4 @12050 (pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice);
    cuCtxDestroy @2000 (ctx: CUcontext);
    cuCtxDestroy_v2 @4000 (ctx: CUcontext);
    cuCtxSetLimit @3010 (limit: CUlimit, value: usize);
    cuDevicePrimaryCtxRetain @7000 (pctx: *mut CUcontext, dev: CUdevice);
    cuDevicePrimaryCtxRelease @7000 (dev: CUdevice);
    cuDevicePrimaryCtxRelease_v2 @11000 (dev: CUdevice);
    cuDevicePrimaryCtxReset @7000 (dev: CUdevice);
    cuDevicePrimaryCtxReset_v2 @11000 (dev: CUdevice);
    cuModuleLoad @2000 (module: *mut CUmodule, fname: *const c_char);
    cuModuleLoadData @2000 (module: *mut CUmodule, image: *const c_void);
    cuModuleLoadDataEx @2010 (module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut CUjit_option, optionValues: *mut *mut c_void);
    cuModuleLoadFatBinary @2000 (module: *mut CUmodule, fatCubin: *const c_void);
    cuModuleUnload @2000 (hmod: CUmodule);
    cuLibraryLoadData @12000 (library: *mut CUlibrary, code: *const c_void, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint);
    cuLibraryLoadFromFile @12000 (library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint);
    cuLibraryUnload @12000 (library: CUlibrary);
    // first use: the driver loads code and globals lazily (CUDA_MODULE_LOADING=LAZY, the default)
    cuModuleGetFunction @2000 (hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char);
    cuModuleGetGlobal_v2 @3020 (dptr: *mut CUdeviceptr, bytes: *mut usize, hmod: CUmodule, name: *const c_char);
    cuModuleGetGlobal @2000 (dptr: *mut CUdeviceptr_v1, bytes: *mut c_uint, hmod: CUmodule, name: *const c_char);
    cuLibraryGetGlobal @12000 (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char);
    cuLibraryGetManaged @12000 (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char);
    cuLibraryGetModule @12000 (pMod: *mut CUmodule, library: CUlibrary);
    cuKernelGetFunction @12000 (pFunc: *mut CUfunction, kernel: CUkernel);
    cuLibraryGetUnifiedFunction @12000 (fptr: *mut *mut c_void, library: CUlibrary, symbol: *const c_char);
    cuModuleGetTexRef @2000 (pTexRef: *mut CUtexref, hmod: CUmodule, name: *const c_char);
    cuModuleGetSurfRef @3000 (pSurfRef: *mut CUsurfref, hmod: CUmodule, name: *const c_char);
    cuFuncLoad @12040 (function: CUfunction);
    // every path that puts work on the GPU (the throttle)
    cuLaunchKernel @4000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernel_ptsz @7000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx @11060 (config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz @11060 (config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel @9000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz @9000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void);
    cuLaunchCooperativeKernelMultiDevice @9000 (launchParamsList: *mut CUDA_LAUNCH_PARAMS, numDevices: c_uint, flags: c_uint);
    cuGraphLaunch @10000 (hGraphExec: CUgraphExec, hStream: CUstream);
    cuGraphLaunch_ptsz @10000 (hGraphExec: CUgraphExec, hStream: CUstream);
    cuLaunch @2000 (f: CUfunction);
    cuLaunchGrid @2000 (f: CUfunction, grid_width: c_int, grid_height: c_int);
    cuLaunchGridAsync @2000 (f: CUfunction, grid_width: c_int, grid_height: c_int, hStream: CUstream);
    // CUDA graphs with memory nodes
    cuGraphInstantiateWithFlags @11040 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64);
    cuGraphInstantiate @10000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize);
    cuGraphInstantiate_v2 @11000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize);
    cuGraphInstantiateWithParams @12000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS);
    cuGraphInstantiateWithParams_ptsz @12000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS);
    cuGraphUpload @11010 (hGraphExec: CUgraphExec, hStream: CUstream);
    cuGraphUpload_ptsz @11010 (hGraphExec: CUgraphExec, hStream: CUstream);
    cuGraphAddNode @12020 (phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUgraphNodeParams);
    cuGraphAddNode_v2 @12030 (phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, nodeParams: *mut CUgraphNodeParams);
    cuGraphAddChildGraphNode @10000 (phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, childGraph: CUgraph);
    cuGraphClone @10000 (phGraphClone: *mut CUgraph, originalGraph: CUgraph);
    cuGraphExecDestroy @10000 (hGraphExec: CUgraphExec);
    cuDeviceGraphMemTrim @11040 (device: CUdevice);
    cuGraphExecUpdate_v2 @12000 (hGraphExec: CUgraphExec, hGraph: CUgraph, resultInfo: *mut CUgraphExecUpdateResultInfo);
    cuGraphExecUpdate @10020 (hGraphExec: CUgraphExec, hGraph: CUgraph, hErrorNode_out: *mut CUgraphNode, updateResult_out: *mut CUgraphExecUpdateResult);
    cuGraphExecChildGraphNodeSetParams @11010 (hGraphExec: CUgraphExec, hNode: CUgraphNode, childGraph: CUgraph);
    cuGraphExecNodeSetParams @12020 (hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams);
    cuGraphExecKernelNodeSetParams_v2 @12000 (hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS);
    cuGraphExecKernelNodeSetParams @10010 (hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1);
    // copies and memsets (best-effort ones are gated by priority)
    cuMemcpyHtoD_v2 @3020 (dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize);
    cuMemcpyHtoD_v2_ptds @7000 (dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize);
    cuMemcpyDtoH_v2 @3020 (dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyDtoH_v2_ptds @7000 (dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyDtoD_v2 @3020 (dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyDtoD_v2_ptds @7000 (dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyDtoA_v2 @3020 (dstArray: CUarray, dstOffset: usize, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyDtoA_v2_ptds @7000 (dstArray: CUarray, dstOffset: usize, srcDevice: CUdeviceptr, ByteCount: usize);
    cuMemcpyAtoD_v2 @3020 (dstDevice: CUdeviceptr, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpyAtoD_v2_ptds @7000 (dstDevice: CUdeviceptr, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpyHtoA_v2 @3020 (dstArray: CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize);
    cuMemcpyHtoA_v2_ptds @7000 (dstArray: CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize);
    cuMemcpyAtoH_v2 @3020 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpyAtoH_v2_ptds @7000 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpyAtoA_v2 @3020 (dstArray: CUarray, dstOffset: usize, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpyAtoA_v2_ptds @7000 (dstArray: CUarray, dstOffset: usize, srcArray: CUarray, srcOffset: usize, ByteCount: usize);
    cuMemcpy @4000 (dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize);
    cuMemcpy_ptds @7000 (dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize);
    cuMemcpyPeer @4000 (dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize);
    cuMemcpyPeer_ptds @7000 (dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize);
    cuMemcpy2D_v2 @3020 (pCopy: *const CUDA_MEMCPY2D);
    cuMemcpy2D_v2_ptds @7000 (pCopy: *const CUDA_MEMCPY2D);
    cuMemcpy2DUnaligned_v2 @3020 (pCopy: *const CUDA_MEMCPY2D);
    cuMemcpy2DUnaligned_v2_ptds @7000 (pCopy: *const CUDA_MEMCPY2D);
    cuMemcpy3D_v2 @3020 (pCopy: *const CUDA_MEMCPY3D);
    cuMemcpy3D_v2_ptds @7000 (pCopy: *const CUDA_MEMCPY3D);
    cuMemcpy3DPeer @4000 (pCopy: *const CUDA_MEMCPY3D_PEER);
    cuMemcpy3DPeer_ptds @7000 (pCopy: *const CUDA_MEMCPY3D_PEER);
    cuMemcpyHtoDAsync_v2 @3020 (dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    cuMemcpyHtoDAsync_v2_ptsz @7000 (dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    cuMemcpyDtoHAsync_v2 @3020 (dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyDtoHAsync_v2_ptsz @7000 (dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyDtoDAsync_v2 @3020 (dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyDtoDAsync_v2_ptsz @7000 (dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyHtoAAsync_v2 @3020 (dstArray: CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    cuMemcpyHtoAAsync_v2_ptsz @7000 (dstArray: CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    cuMemcpyAtoHAsync_v2 @3020 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: usize, ByteCount: usize, hStream: CUstream);
    cuMemcpyAtoHAsync_v2_ptsz @7000 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: usize, ByteCount: usize, hStream: CUstream);
    cuMemcpyAsync @4000 (dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyAsync_ptsz @7000 (dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    cuMemcpyPeerAsync @4000 (dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize, hStream: CUstream);
    cuMemcpyPeerAsync_ptsz @7000 (dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize, hStream: CUstream);
    cuMemcpy2DAsync_v2 @3020 (pCopy: *const CUDA_MEMCPY2D, hStream: CUstream);
    cuMemcpy2DAsync_v2_ptsz @7000 (pCopy: *const CUDA_MEMCPY2D, hStream: CUstream);
    cuMemcpy3DAsync_v2 @3020 (pCopy: *const CUDA_MEMCPY3D, hStream: CUstream);
    cuMemcpy3DAsync_v2_ptsz @7000 (pCopy: *const CUDA_MEMCPY3D, hStream: CUstream);
    cuMemcpy3DPeerAsync @4000 (pCopy: *const CUDA_MEMCPY3D_PEER, hStream: CUstream);
    cuMemcpy3DPeerAsync_ptsz @7000 (pCopy: *const CUDA_MEMCPY3D_PEER, hStream: CUstream);
    cuMemcpyBatchAsync @12080 (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut CUmemcpyAttributes, attrIdxs: *mut usize, numAttrs: usize, failIdx: *mut usize, hStream: CUstream);
    cuMemcpyBatchAsync_ptsz @12080 (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut CUmemcpyAttributes, attrIdxs: *mut usize, numAttrs: usize, failIdx: *mut usize, hStream: CUstream);
    cuMemcpyBatchAsync_v2 @13000 (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut CUmemcpyAttributes, attrIdxs: *mut usize, numAttrs: usize, hStream: CUstream);
    cuMemcpyBatchAsync_v2_ptsz @13000 (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut CUmemcpyAttributes, attrIdxs: *mut usize, numAttrs: usize, hStream: CUstream);
    cuMemcpy3DBatchAsync @12080 (numParams: usize, opList: *mut CUDA_MEMCPY3D_BATCH_OP, failIdx: *mut usize, flags: u64, hStream: CUstream);
    cuMemcpy3DBatchAsync_ptsz @12080 (numParams: usize, opList: *mut CUDA_MEMCPY3D_BATCH_OP, failIdx: *mut usize, flags: u64, hStream: CUstream);
    cuMemcpy3DBatchAsync_v2 @13000 (numParams: usize, opList: *mut CUDA_MEMCPY3D_BATCH_OP, flags: u64, hStream: CUstream);
    cuMemcpy3DBatchAsync_v2_ptsz @13000 (numParams: usize, opList: *mut CUDA_MEMCPY3D_BATCH_OP, flags: u64, hStream: CUstream);
    cuMemsetD8_v2 @3020 (dstDevice: CUdeviceptr, uc: u8, N: usize);
    cuMemsetD8_v2_ptds @7000 (dstDevice: CUdeviceptr, uc: u8, N: usize);
    cuMemsetD2D8_v2 @3020 (dstDevice: CUdeviceptr, dstPitch: usize, uc: u8, Width: usize, Height: usize);
    cuMemsetD2D8_v2_ptds @7000 (dstDevice: CUdeviceptr, dstPitch: usize, uc: u8, Width: usize, Height: usize);
    cuMemsetD8Async @3020 (dstDevice: CUdeviceptr, uc: u8, N: usize, hStream: CUstream);
    cuMemsetD8Async_ptsz @7000 (dstDevice: CUdeviceptr, uc: u8, N: usize, hStream: CUstream);
    cuMemsetD2D8Async @3020 (dstDevice: CUdeviceptr, dstPitch: usize, uc: u8, Width: usize, Height: usize, hStream: CUstream);
    cuMemsetD2D8Async_ptsz @7000 (dstDevice: CUdeviceptr, dstPitch: usize, uc: u8, Width: usize, Height: usize, hStream: CUstream);
    cuMemsetD16_v2 @3020 (dstDevice: CUdeviceptr, us: u16, N: usize);
    cuMemsetD16_v2_ptds @7000 (dstDevice: CUdeviceptr, us: u16, N: usize);
    cuMemsetD2D16_v2 @3020 (dstDevice: CUdeviceptr, dstPitch: usize, us: u16, Width: usize, Height: usize);
    cuMemsetD2D16_v2_ptds @7000 (dstDevice: CUdeviceptr, dstPitch: usize, us: u16, Width: usize, Height: usize);
    cuMemsetD16Async @3020 (dstDevice: CUdeviceptr, us: u16, N: usize, hStream: CUstream);
    cuMemsetD16Async_ptsz @7000 (dstDevice: CUdeviceptr, us: u16, N: usize, hStream: CUstream);
    cuMemsetD2D16Async @3020 (dstDevice: CUdeviceptr, dstPitch: usize, us: u16, Width: usize, Height: usize, hStream: CUstream);
    cuMemsetD2D16Async_ptsz @7000 (dstDevice: CUdeviceptr, dstPitch: usize, us: u16, Width: usize, Height: usize, hStream: CUstream);
    cuMemsetD32_v2 @3020 (dstDevice: CUdeviceptr, ui: c_uint, N: usize);
    cuMemsetD32_v2_ptds @7000 (dstDevice: CUdeviceptr, ui: c_uint, N: usize);
    cuMemsetD2D32_v2 @3020 (dstDevice: CUdeviceptr, dstPitch: usize, ui: c_uint, Width: usize, Height: usize);
    cuMemsetD2D32_v2_ptds @7000 (dstDevice: CUdeviceptr, dstPitch: usize, ui: c_uint, Width: usize, Height: usize);
    cuMemsetD32Async @3020 (dstDevice: CUdeviceptr, ui: c_uint, N: usize, hStream: CUstream);
    cuMemsetD32Async_ptsz @7000 (dstDevice: CUdeviceptr, ui: c_uint, N: usize, hStream: CUstream);
    cuMemsetD2D32Async @3020 (dstDevice: CUdeviceptr, dstPitch: usize, ui: c_uint, Width: usize, Height: usize, hStream: CUstream);
    cuMemsetD2D32Async_ptsz @7000 (dstDevice: CUdeviceptr, dstPitch: usize, ui: c_uint, Width: usize, Height: usize, hStream: CUstream);
    // stream memory operations (elastic memory gates them)
    cuStreamWriteValue32 @8000 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWriteValue32_ptsz @8000 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWriteValue32_v2 @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWriteValue32_v2_ptsz @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWaitValue32 @8000 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWaitValue32_ptsz @8000 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWaitValue32_v2 @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWaitValue32_v2_ptsz @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint);
    cuStreamWriteValue64 @9000 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWriteValue64_ptsz @9000 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWriteValue64_v2 @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWriteValue64_v2_ptsz @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWaitValue64 @9000 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWaitValue64_ptsz @9000 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWaitValue64_v2 @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamWaitValue64_v2_ptsz @11070 (stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
    cuStreamBatchMemOp @8000 (stream: CUstream, count: c_uint, paramArray: *mut CUstreamBatchMemOpParams, flags: c_uint);
    cuStreamBatchMemOp_ptsz @8000 (stream: CUstream, count: c_uint, paramArray: *mut CUstreamBatchMemOpParams, flags: c_uint);
    cuStreamBatchMemOp_v2 @11070 (stream: CUstream, count: c_uint, paramArray: *mut CUstreamBatchMemOpParams, flags: c_uint);
    cuStreamBatchMemOp_v2_ptsz @11070 (stream: CUstream, count: c_uint, paramArray: *mut CUstreamBatchMemOpParams, flags: c_uint);
    cuMemcpyHtoD @2000 (dstDevice: CUdeviceptr_v1, srcHost: *const c_void, ByteCount: c_uint);
    cuMemcpyDtoH @2000 (dstHost: *mut c_void, srcDevice: CUdeviceptr_v1, ByteCount: c_uint);
    cuMemcpyDtoD @2000 (dstDevice: CUdeviceptr_v1, srcDevice: CUdeviceptr_v1, ByteCount: c_uint);
    cuMemcpyDtoA @2000 (dstArray: CUarray, dstOffset: c_uint, srcDevice: CUdeviceptr_v1, ByteCount: c_uint);
    cuMemcpyAtoD @2000 (dstDevice: CUdeviceptr_v1, srcArray: CUarray, srcOffset: c_uint, ByteCount: c_uint);
    cuMemcpyHtoA @2000 (dstArray: CUarray, dstOffset: c_uint, srcHost: *const c_void, ByteCount: c_uint);
    cuMemcpyAtoH @2000 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: c_uint, ByteCount: c_uint);
    cuMemcpyAtoA @2000 (dstArray: CUarray, dstOffset: c_uint, srcArray: CUarray, srcOffset: c_uint, ByteCount: c_uint);
    cuMemcpyHtoDAsync @2000 (dstDevice: CUdeviceptr_v1, srcHost: *const c_void, ByteCount: c_uint, hStream: CUstream);
    cuMemcpyDtoHAsync @2000 (dstHost: *mut c_void, srcDevice: CUdeviceptr_v1, ByteCount: c_uint, hStream: CUstream);
    cuMemcpyDtoDAsync @3000 (dstDevice: CUdeviceptr_v1, srcDevice: CUdeviceptr_v1, ByteCount: c_uint, hStream: CUstream);
    cuMemcpyHtoAAsync @2000 (dstArray: CUarray, dstOffset: c_uint, srcHost: *const c_void, ByteCount: c_uint, hStream: CUstream);
    cuMemcpyAtoHAsync @2000 (dstHost: *mut c_void, srcArray: CUarray, srcOffset: c_uint, ByteCount: c_uint, hStream: CUstream);
    cuMemsetD8 @2000 (dstDevice: CUdeviceptr_v1, uc: u8, N: c_uint);
    cuMemsetD2D8 @2000 (dstDevice: CUdeviceptr_v1, dstPitch: c_uint, uc: u8, Width: c_uint, Height: c_uint);
    cuMemsetD16 @2000 (dstDevice: CUdeviceptr_v1, us: u16, N: c_uint);
    cuMemsetD2D16 @2000 (dstDevice: CUdeviceptr_v1, dstPitch: c_uint, us: u16, Width: c_uint, Height: c_uint);
    cuMemsetD32 @2000 (dstDevice: CUdeviceptr_v1, ui: c_uint, N: c_uint);
    cuMemsetD2D32 @2000 (dstDevice: CUdeviceptr_v1, dstPitch: c_uint, ui: c_uint, Width: c_uint, Height: c_uint);
    // called by the preload library itself (not exported)
    cuDriverGetVersion @2020 (driverVersion: *mut c_int);
    cuDeviceGetCount @2000 (count: *mut c_int);
    cuDeviceCanAccessPeer @4000 (canAccessPeer: *mut c_int, dev: CUdevice, peerDev: CUdevice);
    cuDevicePrimaryCtxGetState @7000 (dev: CUdevice, flags: *mut c_uint, active: *mut c_int);
    cuDeviceGet @2000 (device: *mut CUdevice, ordinal: c_int);
    cuDeviceGetUuid @9020 (uuid: *mut CUuuid, dev: CUdevice);
    cuDeviceGetUuid_v2 @11040 (uuid: *mut CUuuid, dev: CUdevice);
    cuCtxGetDevice @2000 (device: *mut CUdevice);
    cuCtxGetLimit @3010 (pvalue: *mut usize, limit: CUlimit);
    cuDeviceGetAttribute @2000 (pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice);
    cuCtxGetCurrent @4000 (pctx: *mut CUcontext);
    cuCtxPushCurrent_v2 @4000 (ctx: CUcontext);
    cuCtxPopCurrent_v2 @4000 (pctx: *mut CUcontext);
    cuStreamGetCtx @9020 (hStream: CUstream, pctx: *mut CUcontext);
    cuKernelGetLibrary @12050 (pLib: *mut CUlibrary, kernel: CUkernel);
    cuStreamIsCapturing @10000 (hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus);
    cuStreamGetDevice @12080 (hStream: CUstream, device: *mut CUdevice);
    cuStreamGetDevice_ptsz @12080 (hStream: CUstream, device: *mut CUdevice);
    cuEventCreate @2000 (phEvent: *mut CUevent, Flags: c_uint);
    cuEventDestroy_v2 @4000 (hEvent: CUevent);
    cuEventRecord @2000 (hEvent: CUevent, hStream: CUstream);
    cuEventQuery @2000 (hEvent: CUevent);
    cuEventSynchronize @2000 (hEvent: CUevent);
    cuEventElapsedTime @2000 (pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
    cuEventElapsedTime_v2 @12080 (pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
    cuMemGetAddressRange_v2 @3020 (pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr);
    cuPointerGetAttribute @4000 (data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr);
    cuMemGetAllocationPropertiesFromHandle @10020 (prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle);
    cuMemGetAllocationGranularity @10020 (granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags);
    cuMemPoolGetAttribute @11020 (pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
    cuDeviceGetMemPool @11020 (pool: *mut CUmemoryPool, dev: CUdevice);
    cuDeviceGetDefaultMemPool @11020 (pool_out: *mut CUmemoryPool, dev: CUdevice);
    cuFuncGetAttribute @2020 (pi: *mut c_int, attrib: CUfunction_attribute, hfunc: CUfunction);
    cuFuncGetModule @11000 (hmod: *mut CUmodule, hfunc: CUfunction);
    cuKernelGetAttribute @12000 (pi: *mut c_int, attrib: CUfunction_attribute, kernel: CUkernel, dev: CUdevice);
    cuDeviceGetGraphMemAttribute @11040 (device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void);
    cuGraphGetNodes @10000 (hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize);
    cuGraphNodeGetType @10000 (hNode: CUgraphNode, typ: *mut CUgraphNodeType);
    cuGraphMemAllocNodeGetParams @11040 (hNode: CUgraphNode, params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS);
    cuGraphChildGraphNodeGetGraph @10000 (hNode: CUgraphNode, phGraph: *mut CUgraph);
    cuGraphKernelNodeGetParams @10000 (hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1);
    cuGraphKernelNodeGetParams_v2 @12000 (hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS);
    cuArrayGetMemoryRequirements @11060 (memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray, device: CUdevice);
    cuMipmappedArrayGetMemoryRequirements @11060 (memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, mipmap: CUmipmappedArray, device: CUdevice);
}

/// Which stream a NULL stream handle means: the legacy default stream, or (in a `_ptsz` entry point) the
/// calling thread's default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultStream {
    /// `CU_STREAM_LEGACY`.
    Legacy,
    /// `CU_STREAM_PER_THREAD`.
    PerThread,
}

/// Bytes per element of a `CUarray_format` (all channels of the format, per declared channel), for the
/// admission estimate of arrays. Formats whose element size the header does not make obvious (block-compressed,
/// planar video) return a conservative 16.
pub fn array_format_bytes(format: CUarray_format) -> u64 {
    match format {
        CU_AD_FORMAT_UNSIGNED_INT8
        | CU_AD_FORMAT_SIGNED_INT8
        | CU_AD_FORMAT_UNORM_INT8X1
        | CU_AD_FORMAT_SNORM_INT8X1 => 1,
        CU_AD_FORMAT_UNSIGNED_INT16
        | CU_AD_FORMAT_SIGNED_INT16
        | CU_AD_FORMAT_HALF
        | CU_AD_FORMAT_UNORM_INT16X1
        | CU_AD_FORMAT_SNORM_INT16X1
        | CU_AD_FORMAT_UNORM_INT8X2
        | CU_AD_FORMAT_SNORM_INT8X2 => 2,
        CU_AD_FORMAT_UNSIGNED_INT32
        | CU_AD_FORMAT_SIGNED_INT32
        | CU_AD_FORMAT_FLOAT
        | CU_AD_FORMAT_UNORM_INT8X4
        | CU_AD_FORMAT_SNORM_INT8X4
        | CU_AD_FORMAT_UNORM_INT16X2
        | CU_AD_FORMAT_SNORM_INT16X2
        | CU_AD_FORMAT_UNORM_INT_101010_2 => 4,
        CU_AD_FORMAT_UNORM_INT16X4 | CU_AD_FORMAT_SNORM_INT16X4 => 8,
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
