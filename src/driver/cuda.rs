//! The CUDA driver functions the shim touches, in two lists: the hooked ones (exported by `abi::cuda` under the
//! same names, each with a real counterpart here) and helpers the shim only calls. Signatures are transcribed from
//! `cuda.h` (CUDA 13.0); the legacy bare names use the old 32-bit ABI declared in its
//! `__CUDA_API_VERSION_INTERNAL` section. `cuLaunch`, `cuLaunchGrid` and `cuLaunchGridAsync` are no longer declared
//! by the 13.0 header; their signatures are CUDA 12's.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Invokes `$cb! { [ hooked list ] }` with every exported (hooked) CUDA function.
macro_rules! cuda_hooked {
    ($cb:ident) => {
        $cb! { [
            // initialisation and symbol lookup
            cuInit(Flags: c_uint);
            cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t);
            cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t,
                symbolStatus: *mut CUdriverProcAddressQueryResult);
            // linear allocations
            cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
            cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint);
            cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize,
                ElementSizeBytes: c_uint);
            cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint,
                ElementSizeBytes: c_uint);
            cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
            cuMemFree_v2(dptr: CUdeviceptr);
            cuMemFree(dptr: CUdeviceptr_v1);
            // stream-ordered allocator
            cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
            cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
            cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
            cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
            cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream);
            cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream);
            cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps);
            cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize);
            cuMemPoolDestroy(pool: CUmemoryPool);
            // virtual memory management
            cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp,
                flags: u64);
            cuMemRelease(handle: CUmemGenericAllocationHandle);
            // arrays
            cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR);
            cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1);
            cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR);
            cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1);
            cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR,
                numMipmapLevels: c_uint);
            cuArrayDestroy(hArray: CUarray);
            cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray);
            // what the program is told about memory
            cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
            cuMemGetInfo(free: *mut c_uint, total: *mut c_uint);
            cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
            cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice);
            // contexts and modules (overhead measurement)
            cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
            cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
            cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int,
                flags: c_uint, dev: CUdevice);
            cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint,
                dev: CUdevice);
            cuCtxDestroy(ctx: CUcontext);
            cuCtxDestroy_v2(ctx: CUcontext);
            cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
            cuDevicePrimaryCtxRelease(dev: CUdevice);
            cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
            cuDevicePrimaryCtxReset(dev: CUdevice);
            cuDevicePrimaryCtxReset_v2(dev: CUdevice);
            cuModuleLoad(module: *mut CUmodule, fname: *const c_char);
            cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
            cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, numOptions: c_uint,
                options: *mut CUjit_option, optionValues: *mut *mut c_void);
            cuModuleLoadFatBinary(module: *mut CUmodule, fatCubin: *const c_void);
            cuModuleUnload(hmod: CUmodule);
            cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jitOptions: *mut CUjit_option,
                jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption,
                libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint);
            cuLibraryLoadFromFile(library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut CUjit_option,
                jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption,
                libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint);
            cuLibraryUnload(library: CUlibrary);
            // every path that puts work on the GPU (hooks/launch.rs, owned by the throttle)
            cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint,
                blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream,
                kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint,
                blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream,
                kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void,
                extra: *mut *mut c_void);
            cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void,
                extra: *mut *mut c_void);
            cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint,
                blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream,
                kernelParams: *mut *mut c_void);
            cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint,
                blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream,
                kernelParams: *mut *mut c_void);
            cuLaunchCooperativeKernelMultiDevice(launchParamsList: *mut CUDA_LAUNCH_PARAMS, numDevices: c_uint,
                flags: c_uint);
            cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream);
            cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream);
            cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: *mut c_void, flags: u64);
            cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: *mut c_void, phErrorNode: *mut *mut c_void,
                logBuffer: *mut c_char, bufferSize: usize);
            cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: *mut c_void, phErrorNode: *mut *mut c_void,
                logBuffer: *mut c_char, bufferSize: usize);
            cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: *mut c_void,
                instantiateParams: *mut c_void);
            cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: *mut c_void,
                instantiateParams: *mut c_void);
            cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream);
            cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream);
            cuGraphExecDestroy(hGraphExec: CUgraphExec);
            cuDeviceGraphMemTrim(device: CUdevice);
            cuLaunch(f: CUfunction);
            cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int);
            cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, hStream: CUstream);
        ] }
    };
}
pub(crate) use cuda_hooked;

/// Builds the table from the hooked list plus the helpers the shim calls but does not export.
macro_rules! cuda_table {
    ( [ $( $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )* ] ) => {
        crate::driver::function_table! {
            /// Real CUDA driver entry points.
            CudaTable -> CUresult;
            missing_library = CUresult::ERROR_NOT_INITIALIZED, missing_symbol = CUresult::ERROR_NOT_FOUND;
            [
                $( $name ( $( $arg : $ty ),* ); )*
                cuDriverGetVersion(driverVersion: *mut c_int);
                cuDeviceGetCount(count: *mut c_int);
                cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
                cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
                cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
                cuCtxGetDevice(device: *mut CUdevice);
                cuCtxGetCurrent(pctx: *mut CUcontext);
                cuCtxPushCurrent_v2(ctx: CUcontext);
                cuCtxPopCurrent_v2(pctx: *mut CUcontext);
                cuStreamGetCtx(hStream: CUstream, pctx: *mut CUcontext);
                cuEventCreate(phEvent: *mut CUevent, Flags: c_uint);
                cuEventDestroy_v2(hEvent: CUevent);
                cuEventRecord(hEvent: CUevent, hStream: CUstream);
                cuEventQuery(hEvent: CUevent);
                cuEventElapsedTime(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
                cuEventElapsedTime_v2(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
                cuStreamGetDevice(hStream: CUstream, device: *mut CUdevice);
                cuStreamGetDevice_ptsz(hStream: CUstream, device: *mut CUdevice);
                cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp,
                    option: CUmemAllocationGranularity_flags);
                cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
                cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
                cuDeviceGetGraphMemAttribute(device: CUdevice, attr: c_int, value: *mut c_void);
                cuGraphGetNodes(hGraph: *mut c_void, nodes: *mut *mut c_void, numNodes: *mut usize);
                cuGraphNodeGetType(hNode: *mut c_void, typ: *mut c_int);
                cuGraphMemAllocNodeGetParams(hNode: *mut c_void, params_out: *mut c_void);
                cuArrayGetMemoryRequirements(memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray,
                    device: CUdevice);
                cuMipmappedArrayGetMemoryRequirements(memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
                    mipmap: CUmipmappedArray, device: CUdevice);
            ]
        }
    };
}
cuda_hooked!(cuda_table);
