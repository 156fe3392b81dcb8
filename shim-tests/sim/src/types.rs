//! The C types, enum values and struct layouts of NVIDIA's cuda.h / nvml.h (13.0) that the simulator uses.
//!
//! Every value here was copied from the headers, never guessed; the C smoke test compiles programs against the
//! real headers and exercises them, and `tests::layouts` pins the struct sizes the headers imply.
#![allow(non_camel_case_types, dead_code, missing_docs)]

use std::ffi::c_void;

pub(crate) type CUresult = u32;
pub(crate) type CuResult<T> = Result<T, CUresult>;
pub(crate) type CUdevice = i32;
pub(crate) type CUdeviceptr = u64;
pub(crate) type Handle = *mut c_void;

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub(crate) const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_MAP_FAILED: CUresult = 205;
pub(crate) const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;
pub(crate) const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;
pub(crate) const CU_MEM_HANDLE_TYPE_FABRIC: u32 = 8;

/// CUipcMemHandle (passed by value).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUipcMemHandle {
    pub reserved: [u8; 64],
}
pub(crate) const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub(crate) const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub(crate) const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub(crate) const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub(crate) const CUDA_ERROR_NOT_READY: CUresult = 600;
pub(crate) const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub(crate) const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub(crate) const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub(crate) const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub(crate) const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub(crate) const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub(crate) const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
pub(crate) const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub(crate) const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: CUresult = 903;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CUresult = 906;
pub(crate) const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;
pub(crate) const CUDA_ERROR_INVALID_CLUSTER_SIZE: CUresult = 912;
pub(crate) const CUDA_ERROR_OPERATING_SYSTEM: CUresult = 304;
pub(crate) const CUDA_ERROR_UNKNOWN: CUresult = 999;

// CUdevice_attribute
pub(crate) const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
pub(crate) const CU_DEVICE_ATTRIBUTE_MAX: i32 = 148;

// cuGetProcAddress
pub(crate) const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub(crate) const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub(crate) const CU_GET_PROC_ADDRESS_SUCCESS: u32 = 0;
pub(crate) const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: u32 = 1;
pub(crate) const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: u32 = 2;

// Streams and events
pub(crate) const CU_STREAM_LEGACY: usize = 1;
pub(crate) const CU_STREAM_PER_THREAD: usize = 2;
pub(crate) const CU_STREAM_NON_BLOCKING: u32 = 1;
pub(crate) const CU_EVENT_DISABLE_TIMING: u32 = 2;
pub(crate) const CU_EVENT_INTERPROCESS: u32 = 4;
pub(crate) const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
pub(crate) const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;

// CUmemPool_attribute
pub(crate) const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
pub(crate) const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: u32 = 2;
pub(crate) const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
pub(crate) const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u32 = 4;
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: u32 = 6;
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_HIGH: u32 = 8;

// CUpointer_attribute
pub(crate) const CU_POINTER_ATTRIBUTE_CONTEXT: u32 = 1;
pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: u32 = 3;
pub(crate) const CU_POINTER_ATTRIBUTE_HOST_POINTER: u32 = 4;
pub(crate) const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: u32 = 6;
pub(crate) const CU_POINTER_ATTRIBUTE_BUFFER_ID: u32 = 7;
pub(crate) const CU_POINTER_ATTRIBUTE_IS_MANAGED: u32 = 8;
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
pub(crate) const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: u32 = 11;
pub(crate) const CU_POINTER_ATTRIBUTE_RANGE_SIZE: u32 = 12;
pub(crate) const CU_POINTER_ATTRIBUTE_MAPPED: u32 = 13;
pub(crate) const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: u32 = 17;

// CUmemorytype
pub(crate) const CU_MEMORYTYPE_HOST: u32 = 1;
pub(crate) const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub(crate) const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub(crate) const CU_MEMORYTYPE_UNIFIED: u32 = 4;

// VMM
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;
pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
pub(crate) const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: u32 = 1;

// Arrays
pub(crate) const CUDA_ARRAY3D_LAYERED: u32 = 0x01;
pub(crate) const CUDA_ARRAY3D_CUBEMAP: u32 = 0x04;
pub(crate) const CUDA_ARRAY3D_SPARSE: u32 = 0x40;
pub(crate) const CUDA_ARRAY3D_DEFERRED_MAPPING: u32 = 0x80;

// CUfunction_attribute
pub(crate) const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: i32 = 0;
pub(crate) const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: i32 = 3;
pub(crate) const CU_FUNC_ATTRIBUTE_NUM_REGS: i32 = 4;
pub(crate) const CU_FUNC_ATTRIBUTE_PTX_VERSION: i32 = 5;
pub(crate) const CU_FUNC_ATTRIBUTE_BINARY_VERSION: i32 = 6;
pub(crate) const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
pub(crate) const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 9;
pub(crate) const CU_FUNC_ATTRIBUTE_MAX: i32 = 16;

// Launch
pub(crate) const CU_LAUNCH_PARAM_END: usize = 0;
pub(crate) const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
pub(crate) const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

// Graph node types
pub(crate) const CU_GRAPH_NODE_TYPE_KERNEL: u32 = 0;
pub(crate) const CU_GRAPH_NODE_TYPE_MEMCPY: u32 = 1;
pub(crate) const CU_GRAPH_NODE_TYPE_GRAPH: u32 = 4;
pub(crate) const CU_GRAPH_NODE_TYPE_EMPTY: u32 = 5;
pub(crate) const CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE: u32 = 1;
pub(crate) const CU_GRAPH_NODE_TYPE_MEM_ALLOC: u32 = 10;
pub(crate) const CU_GRAPH_NODE_TYPE_MEM_FREE: u32 = 11;
pub(crate) const CU_GRAPH_NODE_TYPE_CONDITIONAL: u32 = 13;
pub(crate) const CU_GRAPH_COND_TYPE_IF: u32 = 0;
pub(crate) const CU_GRAPH_COND_TYPE_WHILE: u32 = 1;
pub(crate) const CU_GRAPH_COND_ASSIGN_DEFAULT: u32 = 1;
pub(crate) const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub(crate) const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
pub(crate) const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: u32 = 0;
pub(crate) const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: u32 = 1;
pub(crate) const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: u32 = 2;
pub(crate) const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: u32 = 3;

/// CUuuid
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CUuuid {
    pub bytes: [u8; 16],
}

/// CUDA_ARRAY_DESCRIPTOR_v2
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

/// CUDA_ARRAY_DESCRIPTOR_v1 (the pre-3.2 ABI: 32-bit sizes)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ArrayDescriptorV1 {
    pub width: u32,
    pub height: u32,
    pub format: u32,
    pub num_channels: u32,
}

/// CUDA_ARRAY3D_DESCRIPTOR_v2
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Array3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// CUDA_ARRAY3D_DESCRIPTOR_v1
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Array3DDescriptorV1 {
    pub width: u32,
    pub height: u32,
    pub depth: u32,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// CUDA_ARRAY_MEMORY_REQUIREMENTS_v1
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [u32; 4],
}

/// CUmemLocation
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemLocation {
    pub type_: u32,
    pub id: i32,
}

/// CUmemPoolProps_v1
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MemPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location: MemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// CUDA_MEM_ALLOC_NODE_PARAMS (v1; v2 has the same layout)
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MemAllocNodeParams {
    pub pool_props: MemPoolProps,
    pub access_descs: *const MemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// CUmemAllocationProp_v1
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// CUmemAccessDesc_v1
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

/// CUlaunchAttribute (id, pad, 64-byte value union)
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// CUlaunchConfig
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub attrs: *mut LaunchAttribute,
    pub num_attrs: u32,
}

/// CUDA_LAUNCH_PARAMS_v1
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LaunchParams {
    pub function: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub kernel_params: *mut *mut c_void,
}

/// CUDA_KERNEL_NODE_PARAMS_v2 (v1 is its prefix, without `kern` and `ctx`)
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct KernelNodeParams {
    pub func: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: Handle,
    pub ctx: Handle,
}

/// CUDA_GRAPH_INSTANTIATE_PARAMS
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: Handle,
    pub err_node_out: Handle,
    pub result_out: u32,
}

/// CUgraphNodeParams: the type, then a union of the node types' parameter structs (only the child graph's
/// `{CUgraph graph; CUgraphChildGraphNodeOwnership ownership;}` is read, as the first two words).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GraphNodeParams {
    pub type_: u32,
    pub reserved0: [i32; 3],
    pub union_: [i64; 29],
    pub reserved2: i64,
}

/// CUgraphExecUpdateResultInfo
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GraphExecUpdateResultInfo {
    pub result: u32,
    pub error_node: Handle,
    pub error_from_node: Handle,
}

pub(crate) const CU_GRAPH_EXEC_UPDATE_SUCCESS: u32 = 0;
pub(crate) const CU_GRAPH_EXEC_UPDATE_ERROR: u32 = 1;
pub(crate) const CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED: u32 = 2;

/// CUarrayMapInfo (cuMemMapArrayAsync)
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ArrayMapInfo {
    pub resource_type: u32,
    pub resource: u64,
    pub subresource_type: u32,
    /// The sparse level `{level, layer, offsetX/Y/Z, extent W/H/D}` or mip tail `{layer, offset, size}`.
    pub subresource: [u64; 4],
    pub mem_operation_type: u32,
    pub mem_handle_type: u32,
    pub mem_handle: u64,
    pub offset: u64,
    pub device_bit_mask: u32,
    pub flags: u32,
    pub reserved: [u32; 2],
}

pub(crate) const CU_RESOURCE_TYPE_ARRAY: u32 = 0;
pub(crate) const CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: u32 = 1;
pub(crate) const CU_MEM_OPERATION_TYPE_MAP: u32 = 1;
pub(crate) const CU_MEM_OPERATION_TYPE_UNMAP: u32 = 2;
pub(crate) const CU_MEM_HANDLE_TYPE_GENERIC: u32 = 0;

/// CUmulticastObjectProp
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MulticastObjectProp {
    pub num_devices: u32,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

/// CUctxCreateParams
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CtxCreateParams {
    pub exec_affinity_params: *mut c_void,
    pub num_exec_affinity_params: i32,
    pub cig_params: *mut c_void,
}

/// CUDA_MEMCPY2D_v2
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Memcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: Handle,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: Handle,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

// ---- NVML ----

pub(crate) type NvmlReturn = u32;
pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
pub(crate) const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub(crate) const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub(crate) const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub(crate) const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub(crate) const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
pub(crate) const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub(crate) const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub(crate) const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// nvmlGpuFabricInfo_v3_t (v2 is its first 36 bytes)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlGpuFabricInfoV3 {
    pub version: u32,
    pub cluster_uuid: [u8; 16],
    pub status: NvmlReturn,
    pub clique_id: u32,
    pub state: u8,
    pub health_mask: u32,
    pub health_summary: u8,
}

/// NVML_STRUCT_VERSION(GpuFabricInfo, 2 / 3)
pub(crate) const NVML_GPU_FABRIC_INFO_V2: u32 = 36 | (2 << 24);
pub(crate) const NVML_GPU_FABRIC_INFO_V3: u32 = 40 | (3 << 24);
pub(crate) const NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: u8 = 0;

/// nvmlGpuP2PCapsIndex_t / nvmlGpuP2PStatus_t
pub(crate) const NVML_P2P_CAPS_INDEX_READ: u32 = 0;
pub(crate) const NVML_P2P_CAPS_INDEX_WRITE: u32 = 1;
pub(crate) const NVML_P2P_CAPS_INDEX_PCI: u32 = 4;
pub(crate) const NVML_P2P_STATUS_OK: u32 = 0;
pub(crate) const NVML_P2P_STATUS_NOT_SUPPORTED: u32 = 5;

/// nvmlMemory_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// nvmlMemory_v2_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2` = NVML_STRUCT_VERSION(Memory, 2) = sizeof(nvmlMemory_v2_t) | 2 << 24
pub(crate) const NVML_MEMORY_V2: u32 = std::mem::size_of::<NvmlMemoryV2>() as u32 | (2 << 24);

/// nvmlProcessInfo_v1_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// nvmlProcessInfo_v2_t (= nvmlProcessInfo_t, used by _v2 and _v3)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlProcessInfoV2 {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// nvmlProcessDetail_v1_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlProcessDetailV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub used_gpu_cc_protected_memory: u64,
}

/// nvmlProcessDetailList_v1_t
#[repr(C)]
#[derive(Debug)]
pub(crate) struct NvmlProcessDetailListV1 {
    pub version: u32,
    /// 0 compute, 1 graphics, 2 MPS compute (NVML_PROCESS_MODE_*; not spelled out in the CUDA 13.0 nvml.h).
    pub mode: u32,
    pub num_proc_array_entries: u32,
    pub proc_array: *mut NvmlProcessDetailV1,
}

/// nvmlProcessDetailList_v1 = NVML_STRUCT_VERSION(ProcessDetailList, 1).
pub(crate) const NVML_PROCESS_DETAIL_LIST_V1: u32 =
    std::mem::size_of::<NvmlProcessDetailListV1>() as u32 | (1 << 24);

/// nvmlProcessUtilizationInfo_v1_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlProcessUtilizationInfoV1 {
    pub time_stamp: u64,
    pub pid: u32,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
    pub jpg_util: u32,
    pub ofa_util: u32,
}

/// nvmlProcessesUtilizationInfo_v1_t
#[repr(C)]
#[derive(Debug)]
pub(crate) struct NvmlProcessesUtilizationInfoV1 {
    pub version: u32,
    pub process_samples_count: u32,
    pub last_seen_time_stamp: u64,
    pub proc_util_array: *mut NvmlProcessUtilizationInfoV1,
}

/// nvmlProcessesUtilizationInfo_v1 = NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1).
pub(crate) const NVML_PROCESSES_UTILIZATION_INFO_V1: u32 =
    std::mem::size_of::<NvmlProcessesUtilizationInfoV1>() as u32 | (1 << 24);

/// nvmlAccountingStats_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlAccountingStats {
    pub gpu_utilization: u32,
    pub memory_utilization: u32,
    pub max_memory_usage: u64,
    pub time: u64,
    pub start_time: u64,
    pub is_running: u32,
    pub reserved: [u32; 5],
}

/// nvmlEncoderSessionInfo_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlEncoderSessionInfo {
    pub session_id: u32,
    pub pid: u32,
    pub vgpu_instance: u32,
    pub codec_type: u32,
    pub h_resolution: u32,
    pub v_resolution: u32,
    pub average_fps: u32,
    pub average_latency: u32,
}

/// nvmlFBCSessionInfo_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlFbcSessionInfo {
    pub session_id: u32,
    pub pid: u32,
    pub vgpu_instance: u32,
    pub display_ordinal: u32,
    pub session_type: u32,
    pub session_flags: u32,
    pub h_max_resolution: u32,
    pub v_max_resolution: u32,
    pub h_resolution: u32,
    pub v_resolution: u32,
    pub average_fps: u32,
    pub average_latency: u32,
}

/// nvmlProcessUtilizationSample_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

/// nvmlUtilization_t
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlUtilization {
    pub gpu: u32,
    pub memory: u32,
}

/// nvmlPciInfo_t
/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct NvmlEventData {
    pub device: *mut std::ffi::c_void,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// `nvmlEventTypeXidCriticalError`.
pub(crate) const NVML_EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlPciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [u8; 32],
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn layouts() {
        assert_eq!(size_of::<Array3DDescriptor>(), 40);
        assert_eq!(size_of::<ArrayDescriptor>(), 24);
        assert_eq!(size_of::<ArrayMemoryRequirements>(), 32);
        assert_eq!(size_of::<MemPoolProps>(), 88);
        assert_eq!(size_of::<MemAllocNodeParams>(), 120);
        assert_eq!(size_of::<GraphNodeParams>(), 256);
        assert_eq!(size_of::<ArrayMapInfo>(), 96);
        assert_eq!(size_of::<MulticastObjectProp>(), 32);
        assert_eq!(size_of::<GraphExecUpdateResultInfo>(), 24);
        assert_eq!(size_of::<MemAllocationProp>(), 32);
        assert_eq!(size_of::<LaunchAttribute>(), 72);
        assert_eq!(size_of::<LaunchConfig>(), 56);
        assert_eq!(size_of::<KernelNodeParams>(), 72);
        assert_eq!(size_of::<Memcpy2D>(), 128);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(size_of::<NvmlProcessInfoV1>(), 16);
        assert_eq!(size_of::<NvmlProcessInfoV2>(), 24);
        assert_eq!(size_of::<NvmlProcessUtilizationSample>(), 32);
        assert_eq!(size_of::<NvmlAccountingStats>(), 56);
        assert_eq!(size_of::<NvmlEncoderSessionInfo>(), 32);
        assert_eq!(size_of::<NvmlFbcSessionInfo>(), 48);
        assert_eq!(size_of::<NvmlProcessUtilizationInfoV1>(), 40);
        assert_eq!(size_of::<NvmlProcessesUtilizationInfoV1>(), 24);
        assert_eq!(size_of::<NvmlProcessDetailV1>(), 32);
        assert_eq!(size_of::<NvmlProcessDetailListV1>(), 24);
        assert_eq!(size_of::<NvmlPciInfo>(), 68);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(size_of::<NvmlGpuFabricInfoV3>(), 40);
        assert_eq!(std::mem::offset_of!(NvmlGpuFabricInfoV3, state), 28);
        assert_eq!(std::mem::offset_of!(NvmlGpuFabricInfoV3, health_summary), 36);
        assert_eq!(NVML_GPU_FABRIC_INFO_V2, 0x0200_0024);
        assert_eq!(NVML_GPU_FABRIC_INFO_V3, 0x0300_0028);
    }
}
