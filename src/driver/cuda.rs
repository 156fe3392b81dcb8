//! Every CUDA driver function the shim touches, one line each, in one list ([`cuda_functions!`]) from which the
//! real-function table (here), the exports and their dispatch (`abi::cuda`) and the check against NVIDIA's
//! headers (`driver::header_check`) are generated.
//!
//! A line: `name @version (args) => module::hook(exprs);`. `version` is the CUDA version of that ABI, as in
//! `cudaTypedefs.h`'s `PFN_<name>_v<version>[_ptsz]` (the test checks the signature against that typedef).
//! The hook is `crate::hooks::<module>::<hook>(shim, exprs…)`: the expressions may use the arguments, `call`
//! (the real function with the caller's arguments) and `real` (the real function, taking arguments). So the
//! `_v2`, `_v3`, `_ptsz` and legacy forms of a call are lines naming the same hook: adding an entry point of a
//! new CUDA version is one line. `helpers` are functions the shim calls but does not export.
//!
//! The legacy bare names use the old 32-bit ABI that `cuda.h` declares under `__CUDA_API_VERSION_INTERNAL`.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Invokes `$cb! { (call, real) hooked [ … ] helpers [ … ] }` with every CUDA function the shim touches.
macro_rules! cuda_functions {
    ($cb:ident) => {
        $cb! { (call, real) hooked [
            // initialisation and symbol lookup
            cuInit @2000 (Flags: c_uint) => context::init(call);
            cuGetProcAddress @11030 (symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t) => proc_address::get_proc_address(call, pfn);
            cuGetProcAddress_v2 @12000 (symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult) => proc_address::get_proc_address(call, pfn);
            // linear allocations
            cuMemAlloc_v2 @3020 (dptr: *mut CUdeviceptr, bytesize: usize) => memory::alloc(call, dptr, bytesize);
            cuMemAlloc @2000 (dptr: *mut CUdeviceptr_v1, bytesize: c_uint) => memory::alloc(call, dptr, bytesize);
            cuMemAllocManaged @6000 (dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => memory::alloc(call, dptr, bytesize);
            cuMemAllocPitch_v2 @3020 (dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) => memory::alloc_pitch(call, dptr, pPitch, WidthInBytes, Height);
            cuMemAllocPitch @2000 (dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint) => memory::alloc_pitch(call, dptr, pPitch, WidthInBytes, Height);
            cuMemFree_v2 @3020 (dptr: CUdeviceptr) => memory::free(call, dptr);
            cuMemFree @2000 (dptr: CUdeviceptr_v1) => memory::free(call, dptr);
            // stream-ordered allocator
            cuMemAllocAsync @11020 (dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) => memory::alloc_async(call, dptr, bytesize, None, hStream, DefaultStream::Legacy);
            cuMemAllocAsync_ptsz @11020 (dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) => memory::alloc_async(call, dptr, bytesize, None, hStream, DefaultStream::PerThread);
            cuMemAllocFromPoolAsync @11020 (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) => memory::alloc_async(call, dptr, bytesize, Some(pool), hStream, DefaultStream::Legacy);
            cuMemAllocFromPoolAsync_ptsz @11020 (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) => memory::alloc_async(call, dptr, bytesize, Some(pool), hStream, DefaultStream::PerThread);
            cuMemFreeAsync @11020 (dptr: CUdeviceptr, hStream: CUstream) => memory::free_async(call, dptr, hStream, DefaultStream::Legacy);
            cuMemFreeAsync_ptsz @11020 (dptr: CUdeviceptr, hStream: CUstream) => memory::free_async(call, dptr, hStream, DefaultStream::PerThread);
            cuMemPoolCreate @11020 (pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) => memory::pool_create(call, pool, poolProps);
            cuMemPoolTrimTo @11020 (pool: CUmemoryPool, minBytesToKeep: usize) => memory::pool_trim(call, pool);
            cuMemPoolDestroy @11020 (pool: CUmemoryPool) => memory::pool_destroy(call, pool);
            cuCtxSynchronize @2000 () => memory::ctx_synchronize(call, None);
            cuCtxSynchronize_v2 @13000 (ctx: CUcontext) => memory::ctx_synchronize(call, Some(ctx));
            cuStreamSynchronize @2000 (hStream: CUstream) => memory::stream_synchronize(call, hStream, DefaultStream::Legacy);
            cuStreamSynchronize_ptsz @7000 (hStream: CUstream) => memory::stream_synchronize(call, hStream, DefaultStream::PerThread);
            cuMemPoolExportPointer @11020 (shareData_out: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr) => memory::pool_export_pointer(call, shareData_out, ptr);
            cuMemPoolImportPointer @11020 (ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, shareData: *mut CUmemPoolPtrExportData) => memory::pool_import_pointer(real, ptr_out, pool, shareData);
            // virtual memory management
            cuMemCreate @10020 (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) => memory::vmm_create(call, handle, size, prop);
            cuMemRelease @10020 (handle: CUmemGenericAllocationHandle) => memory::vmm_release(call, handle);
            cuMemMap @10020 (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) => memory::vmm_map(call, ptr, size, handle);
            cuMemUnmap @10020 (ptr: CUdeviceptr, size: usize) => memory::vmm_unmap(call, ptr, size);
            cuMemMapArrayAsync @11010 (mapInfoList: *mut CUarrayMapInfo, count: c_uint, hStream: CUstream) => memory::map_array_async(call, mapInfoList, count);
            cuMemMapArrayAsync_ptsz @11010 (mapInfoList: *mut CUarrayMapInfo, count: c_uint, hStream: CUstream) => memory::map_array_async(call, mapInfoList, count);
            cuMulticastCreate @12010 (mcHandle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) => memory::multicast_create(call, mcHandle);
            cuMulticastBindMem @12010 (mcHandle: CUmemGenericAllocationHandle, mcOffset: usize, memHandle: CUmemGenericAllocationHandle, memOffset: usize, size: usize, flags: u64) => memory::multicast_bind(call, mcHandle, mcOffset, Some(memHandle), 0, size);
            cuMulticastBindAddr @12010 (mcHandle: CUmemGenericAllocationHandle, mcOffset: usize, memptr: CUdeviceptr, size: usize, flags: u64) => memory::multicast_bind(call, mcHandle, mcOffset, None, memptr, size);
            cuMulticastUnbind @12010 (mcHandle: CUmemGenericAllocationHandle, dev: CUdevice, mcOffset: usize, size: usize) => memory::multicast_unbind(call, mcHandle, dev, mcOffset, size);
            cuMemRetainAllocationHandle @11000 (handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) => memory::vmm_retain(call, handle);
            cuMemExportToShareableHandle @10020 (shareableHandle: *mut c_void, handle: CUmemGenericAllocationHandle, handleType: CUmemAllocationHandleType, flags: u64) => memory::vmm_export(call, shareableHandle, handle, handleType);
            cuMemImportFromShareableHandle @10020 (handle: *mut CUmemGenericAllocationHandle, osHandle: *mut c_void, shHandleType: CUmemAllocationHandleType) => memory::vmm_import(real, handle, osHandle, shHandleType);
            // interprocess memory
            cuIpcGetMemHandle @4010 (pHandle: *mut CUipcMemHandle, dptr: CUdeviceptr) => memory::ipc_get(call, pHandle, dptr);
            cuIpcOpenMemHandle_v2 @11000 (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint) => memory::ipc_open(call, pdptr, handle);
            cuIpcOpenMemHandle @4010 (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint) => memory::ipc_open(call, pdptr, handle);
            cuIpcCloseMemHandle @4010 (dptr: CUdeviceptr) => memory::ipc_close(call, dptr);
            // arrays
            cuArrayCreate_v2 @3020 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR) => memory::array_create(call, pHandle, pAllocateArray);
            cuArrayCreate @2000 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1) => memory::array_create(call, pHandle, pAllocateArray);
            cuArray3DCreate_v2 @3020 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR) => memory::array_create(call, pHandle, pAllocateArray);
            cuArray3DCreate @2000 (pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1) => memory::array_create(call, pHandle, pAllocateArray);
            cuMipmappedArrayCreate @5000 (pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint) => memory::mipmapped_create(call, pHandle, pMipmappedArrayDesc, numMipmapLevels);
            cuArrayDestroy @2000 (hArray: CUarray) => memory::array_destroy(call, hArray);
            cuMipmappedArrayDestroy @5000 (hMipmappedArray: CUmipmappedArray) => memory::mipmapped_destroy(call, hMipmappedArray);
            // what the program is told about memory
            cuMemGetInfo_v2 @3020 (free: *mut usize, total: *mut usize) => info::mem_get_info(real, free, total);
            cuMemGetInfo @2000 (free: *mut c_uint, total: *mut c_uint) => info::mem_get_info(real, free, total);
            cuDeviceTotalMem_v2 @3020 (bytes: *mut usize, dev: CUdevice) => info::device_total_mem(call, bytes, dev);
            cuDeviceTotalMem @2000 (bytes: *mut c_uint, dev: CUdevice) => info::device_total_mem(call, bytes, dev);
            // contexts and modules (overhead measurement)
            cuCtxCreate @2000 (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::ctx_create(call, pctx, dev);
            cuCtxCreate_v2 @3020 (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::ctx_create(call, pctx, dev);
            cuCtxCreate_v3 @11040 (pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice) => context::ctx_create(call, pctx, dev);
            cuCtxCreate_v4 @12050 (pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) => context::ctx_create(call, pctx, dev);
            cuCtxDestroy @2000 (ctx: CUcontext) => context::ctx_destroy(call, ctx);
            cuCtxDestroy_v2 @4000 (ctx: CUcontext) => context::ctx_destroy(call, ctx);
            cuCtxSetLimit @3010 (limit: CUlimit, value: usize) => context::set_limit(call, limit, value);
            cuDevicePrimaryCtxRetain @7000 (pctx: *mut CUcontext, dev: CUdevice) => context::primary_retain(call, pctx, dev);
            cuDevicePrimaryCtxRelease @7000 (dev: CUdevice) => context::primary_release(call, dev, false);
            cuDevicePrimaryCtxRelease_v2 @11000 (dev: CUdevice) => context::primary_release(call, dev, false);
            cuDevicePrimaryCtxReset @7000 (dev: CUdevice) => context::primary_release(call, dev, true);
            cuDevicePrimaryCtxReset_v2 @11000 (dev: CUdevice) => context::primary_release(call, dev, true);
            cuModuleLoad @2000 (module: *mut CUmodule, fname: *const c_char) => context::module_load(call, module);
            cuModuleLoadData @2000 (module: *mut CUmodule, image: *const c_void) => context::module_load(call, module);
            cuModuleLoadDataEx @2010 (module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut CUjit_option, optionValues: *mut *mut c_void) => context::module_load(call, module);
            cuModuleLoadFatBinary @2000 (module: *mut CUmodule, fatCubin: *const c_void) => context::module_load(call, module);
            cuModuleUnload @2000 (hmod: CUmodule) => context::module_unload(call, hmod);
            cuLibraryLoadData @12000 (library: *mut CUlibrary, code: *const c_void, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) => context::library_load(call, library);
            cuLibraryLoadFromFile @12000 (library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) => context::library_load(call, library);
            cuLibraryUnload @12000 (library: CUlibrary) => context::library_unload(call);
            // first use: the driver loads code and globals lazily (CUDA_MODULE_LOADING=LAZY, the default)
            cuModuleGetFunction @2000 (hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) => context::first_use(call, hfunc.cast::<usize>());
            cuModuleGetGlobal_v2 @3020 (dptr: *mut CUdeviceptr, bytes: *mut usize, hmod: CUmodule, name: *const c_char) => context::first_use(call, dptr);
            cuModuleGetGlobal @2000 (dptr: *mut CUdeviceptr_v1, bytes: *mut c_uint, hmod: CUmodule, name: *const c_char) => context::first_use(call, dptr);
            cuLibraryGetGlobal @12000 (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) => context::first_use(call, dptr);
            cuLibraryGetManaged @12000 (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) => context::first_use(call, dptr);
            cuLibraryGetModule @12000 (pMod: *mut CUmodule, library: CUlibrary) => context::first_use(call, pMod.cast::<usize>());
            cuKernelGetFunction @12000 (pFunc: *mut CUfunction, kernel: CUkernel) => context::first_use(call, pFunc.cast::<usize>());
            cuLibraryGetUnifiedFunction @12000 (fptr: *mut *mut c_void, library: CUlibrary, symbol: *const c_char) => context::first_use(call, fptr.cast::<usize>());
            cuModuleGetTexRef @2000 (pTexRef: *mut CUtexref, hmod: CUmodule, name: *const c_char) => context::first_use(call, pTexRef.cast::<usize>());
            cuModuleGetSurfRef @3000 (pSurfRef: *mut CUsurfref, hmod: CUmodule, name: *const c_char) => context::first_use(call, pSurfRef.cast::<usize>());
            cuFuncLoad @12040 (function: CUfunction) => context::function_load(call, function);
            // every path that puts work on the GPU (the throttle)
            cuLaunchKernel @4000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::Legacy);
            cuLaunchKernel_ptsz @7000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::PerThread);
            cuLaunchKernelEx @11060 (config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel_ex(call, config, f, DefaultStream::Legacy);
            cuLaunchKernelEx_ptsz @11060 (config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel_ex(call, config, f, DefaultStream::PerThread);
            cuLaunchCooperativeKernel @9000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) => launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::Legacy);
            cuLaunchCooperativeKernel_ptsz @9000 (f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) => launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::PerThread);
            cuLaunchCooperativeKernelMultiDevice @9000 (launchParamsList: *mut CUDA_LAUNCH_PARAMS, numDevices: c_uint, flags: c_uint) => launch::multi_device(call, launchParamsList, numDevices);
            cuGraphLaunch @10000 (hGraphExec: CUgraphExec, hStream: CUstream) => launch::graph(call, hGraphExec, hStream, DefaultStream::Legacy);
            cuGraphLaunch_ptsz @10000 (hGraphExec: CUgraphExec, hStream: CUstream) => launch::graph(call, hGraphExec, hStream, DefaultStream::PerThread);
            cuLaunch @2000 (f: CUfunction) => launch::kernel(call, f, [1, 1, 1], [0, 0, 0], std::ptr::null_mut(), DefaultStream::Legacy);
            cuLaunchGrid @2000 (f: CUfunction, grid_width: c_int, grid_height: c_int) => launch::grid(call, f, grid_width, grid_height, std::ptr::null_mut());
            cuLaunchGridAsync @2000 (f: CUfunction, grid_width: c_int, grid_height: c_int, hStream: CUstream) => launch::grid(call, f, grid_width, grid_height, hStream);
            // CUDA graphs with memory nodes
            cuGraphInstantiateWithFlags @11040 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64) => graph_memory::instantiate(call, phGraphExec, hGraph);
            cuGraphInstantiate @10000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) => graph_memory::instantiate(call, phGraphExec, hGraph);
            cuGraphInstantiate_v2 @11000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) => graph_memory::instantiate(call, phGraphExec, hGraph);
            cuGraphInstantiateWithParams @12000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) => graph_memory::instantiate(call, phGraphExec, hGraph);
            cuGraphInstantiateWithParams_ptsz @12000 (phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) => graph_memory::instantiate(call, phGraphExec, hGraph);
            cuGraphUpload @11010 (hGraphExec: CUgraphExec, hStream: CUstream) => graph_memory::upload(call, hGraphExec);
            cuGraphUpload_ptsz @11010 (hGraphExec: CUgraphExec, hStream: CUstream) => graph_memory::upload(call, hGraphExec);
            cuGraphExecDestroy @10000 (hGraphExec: CUgraphExec) => graph_memory::exec_destroy(call, hGraphExec);
            cuDeviceGraphMemTrim @11040 (device: CUdevice) => graph_memory::trim(call, device);
            cuGraphExecUpdate_v2 @12000 (hGraphExec: CUgraphExec, hGraph: CUgraph, resultInfo: *mut CUgraphExecUpdateResultInfo) => graph_memory::exec_update(call, hGraphExec, hGraph);
            cuGraphExecUpdate @10020 (hGraphExec: CUgraphExec, hGraph: CUgraph, hErrorNode_out: *mut CUgraphNode, updateResult_out: *mut CUgraphExecUpdateResult) => graph_memory::exec_update(call, hGraphExec, hGraph);
            cuGraphExecChildGraphNodeSetParams @11010 (hGraphExec: CUgraphExec, hNode: CUgraphNode, childGraph: CUgraph) => graph_memory::exec_child_update(call, hGraphExec, childGraph);
            cuGraphExecNodeSetParams @12020 (hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams) => graph_memory::exec_node_update(call, hGraphExec, nodeParams);
        ] helpers [
            cuDriverGetVersion @2020 (driverVersion: *mut c_int);
            cuDeviceGetCount @2000 (count: *mut c_int);
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
            cuKernelGetAttribute @12000 (pi: *mut c_int, attrib: CUfunction_attribute, kernel: CUkernel, dev: CUdevice);
            cuDeviceGetGraphMemAttribute @11040 (device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void);
            cuGraphGetNodes @10000 (hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize);
            cuGraphNodeGetType @10000 (hNode: CUgraphNode, typ: *mut CUgraphNodeType);
            cuGraphMemAllocNodeGetParams @11040 (hNode: CUgraphNode, params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS);
            cuGraphChildGraphNodeGetGraph @10000 (hNode: CUgraphNode, phGraph: *mut CUgraph);
            cuArrayGetMemoryRequirements @11060 (memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray, device: CUdevice);
            cuMipmappedArrayGetMemoryRequirements @11060 (memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, mipmap: CUmipmappedArray, device: CUdevice);
        ] }
    };
}
pub(crate) use cuda_functions;

/// The real-function table from both lists.
macro_rules! cuda_table {
    ( $call:tt hooked [ $($hooked:tt)* ] helpers [ $($helpers:tt)* ] ) => {
        crate::driver::function_table! {
            /// Real CUDA driver entry points.
            CudaTable -> CUresult;
            missing_library = CUresult::ERROR_NOT_INITIALIZED, missing_symbol = CUresult::ERROR_NOT_FOUND;
            [ $($hooked)* $($helpers)* ]
        }
    };
}
cuda_functions!(cuda_table);
