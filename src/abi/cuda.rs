//! CUDA driver exports: the routing list, one line per exported entry point (see `abi::exports!`): its
//! arguments (types from `ffi::cuda`) and the hook it calls. Everything else is not exported and is served by the
//! real driver ("forward by default").

use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::state::Shim;

fn table(s: &Shim) -> &CudaTable {
    &s.cuda
}

crate::abi::exports! { cuda_guard, CUresult, cuda, table, (call, real)
    // initialisation and symbol lookup
    cuInit (Flags) => context::init(call);
    cuGetProcAddress (symbol, pfn, cudaVersion, flags) => proc_address::get_proc_address(call, pfn);
    cuGetProcAddress_v2 (symbol, pfn, cudaVersion, flags, symbolStatus) => proc_address::get_proc_address(call, pfn);
    // linear allocations
    cuMemAlloc_v2 (dptr, bytesize) => memory::alloc(call, dptr, bytesize);
    cuMemAlloc (dptr, bytesize) => memory::alloc(call, dptr, bytesize);
    cuMemAllocManaged (dptr, bytesize, flags) => memory::alloc(call, dptr, bytesize);
    cuMemAllocPitch_v2 (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) => memory::alloc_pitch(call, dptr, pPitch, WidthInBytes, Height);
    cuMemAllocPitch (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) => memory::alloc_pitch(call, dptr, pPitch, WidthInBytes, Height);
    cuMemFree_v2 (dptr) => memory::free(call, dptr);
    cuMemFree (dptr) => memory::free(call, dptr);
    // stream-ordered allocator
    cuMemAllocAsync (dptr, bytesize, hStream) => memory::alloc_async(call, dptr, bytesize, None, hStream, DefaultStream::Legacy);
    cuMemAllocAsync_ptsz (dptr, bytesize, hStream) => memory::alloc_async(call, dptr, bytesize, None, hStream, DefaultStream::PerThread);
    cuMemAllocFromPoolAsync (dptr, bytesize, pool, hStream) => memory::alloc_async(call, dptr, bytesize, Some(pool), hStream, DefaultStream::Legacy);
    cuMemAllocFromPoolAsync_ptsz (dptr, bytesize, pool, hStream) => memory::alloc_async(call, dptr, bytesize, Some(pool), hStream, DefaultStream::PerThread);
    cuMemFreeAsync (dptr, hStream) => memory::free_async(call, dptr, hStream, DefaultStream::Legacy);
    cuMemFreeAsync_ptsz (dptr, hStream) => memory::free_async(call, dptr, hStream, DefaultStream::PerThread);
    cuMemPoolCreate (pool, poolProps) => memory::pool_create(call, pool, poolProps);
    cuMemPoolTrimTo (pool, minBytesToKeep) => memory::pool_trim(call, pool);
    cuMemPoolDestroy (pool) => memory::pool_destroy(call, pool);
    cuCtxSynchronize () => memory::ctx_synchronize(call, None);
    cuCtxSynchronize_v2 (ctx) => memory::ctx_synchronize(call, Some(ctx));
    cuStreamSynchronize (hStream) => memory::stream_synchronize(call, hStream, DefaultStream::Legacy);
    cuStreamSynchronize_ptsz (hStream) => memory::stream_synchronize(call, hStream, DefaultStream::PerThread);
    cuMemPoolExportPointer (shareData_out, ptr) => memory::pool_export_pointer(call, shareData_out, ptr);
    cuMemPoolImportPointer (ptr_out, pool, shareData) => memory::pool_import_pointer(real, ptr_out, pool, shareData);
    // virtual memory management
    cuMemCreate (handle, size, prop, flags) => memory::vmm_create(call, handle, size, prop);
    cuMemRelease (handle) => memory::vmm_release(call, handle);
    cuMemMap (ptr, size, offset, handle, flags) => memory::vmm_map(call, ptr, size, offset, handle);
    cuMemUnmap (ptr, size) => memory::vmm_unmap(call, ptr, size);
    cuMemMapArrayAsync (mapInfoList, count, hStream) => memory::map_array_async(call, mapInfoList, count);
    cuMemMapArrayAsync_ptsz (mapInfoList, count, hStream) => memory::map_array_async(call, mapInfoList, count);
    cuMulticastCreate (mcHandle, prop) => memory::multicast_create(call, mcHandle);
    cuMulticastBindMem (mcHandle, mcOffset, memHandle, memOffset, size, flags) => memory::multicast_bind(call, mcHandle, mcOffset, Some(memHandle), 0, size);
    cuMulticastBindAddr (mcHandle, mcOffset, memptr, size, flags) => memory::multicast_bind(call, mcHandle, mcOffset, None, memptr, size);
    cuMulticastUnbind (mcHandle, dev, mcOffset, size) => memory::multicast_unbind(call, mcHandle, dev, mcOffset, size);
    cuMemRetainAllocationHandle (handle, addr) => memory::vmm_retain(call, handle);
    cuMemExportToShareableHandle (shareableHandle, handle, handleType, flags) => memory::vmm_export(call, shareableHandle, handle, handleType);
    cuMemImportFromShareableHandle (handle, osHandle, shHandleType) => memory::vmm_import(real, handle, osHandle, shHandleType);
    // interprocess memory
    cuIpcGetMemHandle (pHandle, dptr) => memory::ipc_get(call, pHandle, dptr);
    cuIpcOpenMemHandle_v2 (pdptr, handle, Flags) => memory::ipc_open(call, pdptr, handle);
    cuIpcOpenMemHandle (pdptr, handle, Flags) => memory::ipc_open(call, pdptr, handle);
    cuIpcCloseMemHandle (dptr) => memory::ipc_close(call, dptr);
    // arrays
    cuArrayCreate_v2 (pHandle, pAllocateArray) => memory::array_create(call, pHandle, pAllocateArray);
    cuArrayCreate (pHandle, pAllocateArray) => memory::array_create(call, pHandle, pAllocateArray);
    cuArray3DCreate_v2 (pHandle, pAllocateArray) => memory::array_create(call, pHandle, pAllocateArray);
    cuArray3DCreate (pHandle, pAllocateArray) => memory::array_create(call, pHandle, pAllocateArray);
    cuMipmappedArrayCreate (pHandle, pMipmappedArrayDesc, numMipmapLevels) => memory::mipmapped_create(call, pHandle, pMipmappedArrayDesc, numMipmapLevels);
    cuArrayDestroy (hArray) => memory::array_destroy(call, hArray);
    cuMipmappedArrayDestroy (hMipmappedArray) => memory::mipmapped_destroy(call, hMipmappedArray);
    // what the program is told about memory
    cuMemGetInfo_v2 (free, total) => info::mem_get_info(real, free, total);
    cuMemGetInfo (free, total) => info::mem_get_info(real, free, total);
    cuDeviceTotalMem_v2 (bytes, dev) => info::device_total_mem(call, bytes, dev);
    cuDeviceTotalMem (bytes, dev) => info::device_total_mem(call, bytes, dev);
    // contexts and modules (overhead measurement)
    cuCtxCreate (pctx, flags, dev) => context::ctx_create(call, pctx, dev);
    cuCtxCreate_v2 (pctx, flags, dev) => context::ctx_create(call, pctx, dev);
    cuCtxCreate_v3 (pctx, paramsArray, numParams, flags, dev) => context::ctx_create(call, pctx, dev);
    cuCtxCreate_v4 (pctx, ctxCreateParams, flags, dev) => context::ctx_create(call, pctx, dev);
    cuCtxDestroy (ctx) => context::ctx_destroy(call, ctx);
    cuCtxDestroy_v2 (ctx) => context::ctx_destroy(call, ctx);
    cuCtxSetLimit (limit, value) => context::set_limit(call, limit, value);
    cuDevicePrimaryCtxRetain (pctx, dev) => context::primary_retain(call, pctx, dev);
    cuDevicePrimaryCtxRelease (dev) => context::primary_release(call, dev, false);
    cuDevicePrimaryCtxRelease_v2 (dev) => context::primary_release(call, dev, false);
    cuDevicePrimaryCtxReset (dev) => context::primary_release(call, dev, true);
    cuDevicePrimaryCtxReset_v2 (dev) => context::primary_release(call, dev, true);
    cuModuleLoad (module, fname) => context::module_load(call, module, crate::hooks::context::ImageAt::File(fname));
    cuModuleLoadData (module, image) => context::module_load(call, module, crate::hooks::context::ImageAt::Memory(image));
    cuModuleLoadDataEx (module, image, numOptions, options, optionValues) => context::module_load(call, module, crate::hooks::context::ImageAt::Memory(image));
    cuModuleLoadFatBinary (module, fatCubin) => context::module_load(call, module, crate::hooks::context::ImageAt::Memory(fatCubin));
    cuModuleUnload (hmod) => context::module_unload(call, hmod);
    cuLibraryLoadData (library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions) => context::library_load(call, library, crate::hooks::context::ImageAt::Memory(code));
    cuLibraryLoadFromFile (library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions) => context::library_load(call, library, crate::hooks::context::ImageAt::File(fileName));
    cuLibraryUnload (library) => context::library_unload(call, library);
    // first use: the driver loads code and globals lazily (CUDA_MODULE_LOADING=LAZY, the default)
    cuModuleGetFunction (hfunc, hmod, name) => context::first_use(call, hfunc.cast::<usize>(), crate::hooks::context::Owner::Module(hmod));
    cuModuleGetGlobal_v2 (dptr, bytes, hmod, name) => context::first_use(call, dptr, crate::hooks::context::Owner::Module(hmod));
    cuModuleGetGlobal (dptr, bytes, hmod, name) => context::first_use(call, dptr, crate::hooks::context::Owner::Module(hmod));
    cuLibraryGetGlobal (dptr, bytes, library, name) => context::first_use(call, dptr, crate::hooks::context::Owner::Library(library));
    cuLibraryGetManaged (dptr, bytes, library, name) => context::first_use(call, dptr, crate::hooks::context::Owner::Library(library));
    cuLibraryGetModule (pMod, library) => context::library_get_module(call, pMod, library);
    cuKernelGetFunction (pFunc, kernel) => context::first_use(call, pFunc.cast::<usize>(), crate::hooks::context::Owner::Kernel(kernel));
    cuLibraryGetUnifiedFunction (fptr, library, symbol) => context::first_use(call, fptr.cast::<usize>(), crate::hooks::context::Owner::Library(library));
    cuModuleGetTexRef (pTexRef, hmod, name) => context::first_use(call, pTexRef.cast::<usize>(), crate::hooks::context::Owner::Module(hmod));
    cuModuleGetSurfRef (pSurfRef, hmod, name) => context::first_use(call, pSurfRef.cast::<usize>(), crate::hooks::context::Owner::Module(hmod));
    cuFuncLoad (function) => context::function_load(call, function);
    // every path that puts work on the GPU (the throttle)
    cuLaunchKernel (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) => [launch_unhooked] launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::Legacy);
    cuLaunchKernel_ptsz (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) => [launch_unhooked] launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::PerThread);
    cuLaunchKernelEx (config, f, kernelParams, extra) => [launch_unhooked] launch::kernel_ex(call, config, f, DefaultStream::Legacy);
    cuLaunchKernelEx_ptsz (config, f, kernelParams, extra) => [launch_unhooked] launch::kernel_ex(call, config, f, DefaultStream::PerThread);
    cuLaunchCooperativeKernel (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams) => [launch_unhooked] launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::Legacy);
    cuLaunchCooperativeKernel_ptsz (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams) => [launch_unhooked] launch::kernel(call, f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], hStream, DefaultStream::PerThread);
    cuLaunchCooperativeKernelMultiDevice (launchParamsList, numDevices, flags) => [launch_unhooked] launch::multi_device(call, launchParamsList, numDevices);
    cuGraphLaunch (hGraphExec, hStream) => launch::graph(call, hGraphExec, hStream, DefaultStream::Legacy);
    cuGraphLaunch_ptsz (hGraphExec, hStream) => launch::graph(call, hGraphExec, hStream, DefaultStream::PerThread);
    cuLaunch (f) => [launch_unhooked] launch::kernel(call, f, [1, 1, 1], [0, 0, 0], std::ptr::null_mut(), DefaultStream::Legacy);
    cuLaunchGrid (f, grid_width, grid_height) => [launch_unhooked] launch::grid(call, f, grid_width, grid_height, std::ptr::null_mut());
    cuLaunchGridAsync (f, grid_width, grid_height, hStream) => [launch_unhooked] launch::grid(call, f, grid_width, grid_height, hStream);
    // copies and memsets (priority gates best-effort ones)
    cuMemcpyHtoD_v2 (dstDevice, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyHtoD_v2_ptds (dstDevice, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyDtoH_v2 (dstHost, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoH_v2_ptds (dstHost, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyDtoD_v2 (dstDevice, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoD_v2_ptds (dstDevice, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyDtoA_v2 (dstArray, dstOffset, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoA_v2_ptds (dstArray, dstOffset, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyAtoD_v2 (dstDevice, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoD_v2_ptds (dstDevice, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyHtoA_v2 (dstArray, dstOffset, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyHtoA_v2_ptds (dstArray, dstOffset, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyAtoH_v2 (dstHost, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoH_v2_ptds (dstHost, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyAtoA_v2 (dstArray, dstOffset, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoA_v2_ptds (dstArray, dstOffset, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpy (dst, src, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpy_ptds (dst, src, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyPeer (dstDevice, dstContext, srcDevice, srcContext, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyPeer_ptds (dstDevice, dstContext, srcDevice, srcContext, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpy2D_v2 (pCopy) => copy::copy_2d(call, pCopy, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpy2D_v2_ptds (pCopy) => copy::copy_2d(call, pCopy, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpy2DUnaligned_v2 (pCopy) => copy::copy_2d(call, pCopy, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpy2DUnaligned_v2_ptds (pCopy) => copy::copy_2d(call, pCopy, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpy3D_v2 (pCopy) => copy::copy_3d(call, pCopy, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpy3D_v2_ptds (pCopy) => copy::copy_3d(call, pCopy, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpy3DPeer (pCopy) => copy::copy_3d_peer(call, pCopy, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpy3DPeer_ptds (pCopy) => copy::copy_3d_peer(call, pCopy, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemcpyHtoDAsync_v2 (dstDevice, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyHtoDAsync_v2_ptsz (dstDevice, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyDtoHAsync_v2 (dstHost, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyDtoHAsync_v2_ptsz (dstHost, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyDtoDAsync_v2 (dstDevice, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyDtoDAsync_v2_ptsz (dstDevice, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyHtoAAsync_v2 (dstArray, dstOffset, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyHtoAAsync_v2_ptsz (dstArray, dstOffset, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyAtoHAsync_v2 (dstHost, srcArray, srcOffset, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyAtoHAsync_v2_ptsz (dstHost, srcArray, srcOffset, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyAsync (dst, src, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyAsync_ptsz (dst, src, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpyPeerAsync (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyPeerAsync_ptsz (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::PerThread);
    cuMemcpy2DAsync_v2 (pCopy, hStream) => copy::copy_2d(call, pCopy, hStream, DefaultStream::Legacy);
    cuMemcpy2DAsync_v2_ptsz (pCopy, hStream) => copy::copy_2d(call, pCopy, hStream, DefaultStream::PerThread);
    cuMemcpy3DAsync_v2 (pCopy, hStream) => copy::copy_3d(call, pCopy, hStream, DefaultStream::Legacy);
    cuMemcpy3DAsync_v2_ptsz (pCopy, hStream) => copy::copy_3d(call, pCopy, hStream, DefaultStream::PerThread);
    cuMemcpy3DPeerAsync (pCopy, hStream) => copy::copy_3d_peer(call, pCopy, hStream, DefaultStream::Legacy);
    cuMemcpy3DPeerAsync_ptsz (pCopy, hStream) => copy::copy_3d_peer(call, pCopy, hStream, DefaultStream::PerThread);
    cuMemcpyBatchAsync (dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, failIdx, hStream) => copy::batch(call, sizes, count, hStream, DefaultStream::Legacy);
    cuMemcpyBatchAsync_ptsz (dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, failIdx, hStream) => copy::batch(call, sizes, count, hStream, DefaultStream::PerThread);
    cuMemcpyBatchAsync_v2 (dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, hStream) => copy::batch(call, sizes, count, hStream, DefaultStream::Legacy);
    cuMemcpyBatchAsync_v2_ptsz (dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, hStream) => copy::batch(call, sizes, count, hStream, DefaultStream::PerThread);
    cuMemcpy3DBatchAsync (numParams, opList, failIdx, flags, hStream) => copy::flat(call, u64::MAX, hStream, DefaultStream::Legacy);
    cuMemcpy3DBatchAsync_ptsz (numParams, opList, failIdx, flags, hStream) => copy::flat(call, u64::MAX, hStream, DefaultStream::PerThread);
    cuMemcpy3DBatchAsync_v2 (numParams, opList, flags, hStream) => copy::flat(call, u64::MAX, hStream, DefaultStream::Legacy);
    cuMemcpy3DBatchAsync_v2_ptsz (numParams, opList, flags, hStream) => copy::flat(call, u64::MAX, hStream, DefaultStream::PerThread);
    cuMemsetD8_v2 (dstDevice, uc, N) => copy::flat(call, N as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD8_v2_ptds (dstDevice, uc, N) => copy::flat(call, N as u64, std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD2D8_v2 (dstDevice, dstPitch, uc, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D8_v2_ptds (dstDevice, dstPitch, uc, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64), std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD8Async (dstDevice, uc, N, hStream) => copy::flat(call, N as u64, hStream, DefaultStream::Legacy);
    cuMemsetD8Async_ptsz (dstDevice, uc, N, hStream) => copy::flat(call, N as u64, hStream, DefaultStream::PerThread);
    cuMemsetD2D8Async (dstDevice, dstPitch, uc, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64), hStream, DefaultStream::Legacy);
    cuMemsetD2D8Async_ptsz (dstDevice, dstPitch, uc, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64), hStream, DefaultStream::PerThread);
    cuMemsetD16_v2 (dstDevice, us, N) => copy::flat(call, (N as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD16_v2_ptds (dstDevice, us, N) => copy::flat(call, (N as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD2D16_v2 (dstDevice, dstPitch, us, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D16_v2_ptds (dstDevice, dstPitch, us, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD16Async (dstDevice, us, N, hStream) => copy::flat(call, (N as u64).saturating_mul(2), hStream, DefaultStream::Legacy);
    cuMemsetD16Async_ptsz (dstDevice, us, N, hStream) => copy::flat(call, (N as u64).saturating_mul(2), hStream, DefaultStream::PerThread);
    cuMemsetD2D16Async (dstDevice, dstPitch, us, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(2), hStream, DefaultStream::Legacy);
    cuMemsetD2D16Async_ptsz (dstDevice, dstPitch, us, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(2), hStream, DefaultStream::PerThread);
    cuMemsetD32_v2 (dstDevice, ui, N) => copy::flat(call, (N as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD32_v2_ptds (dstDevice, ui, N) => copy::flat(call, (N as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD2D32_v2 (dstDevice, dstPitch, ui, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D32_v2_ptds (dstDevice, dstPitch, ui, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::PerThread);
    cuMemsetD32Async (dstDevice, ui, N, hStream) => copy::flat(call, (N as u64).saturating_mul(4), hStream, DefaultStream::Legacy);
    cuMemsetD32Async_ptsz (dstDevice, ui, N, hStream) => copy::flat(call, (N as u64).saturating_mul(4), hStream, DefaultStream::PerThread);
    cuMemsetD2D32Async (dstDevice, dstPitch, ui, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(4), hStream, DefaultStream::Legacy);
    cuMemsetD2D32Async_ptsz (dstDevice, dstPitch, ui, Width, Height, hStream) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(4), hStream, DefaultStream::PerThread);
    cuMemcpyHtoD (dstDevice, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoH (dstHost, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoD (dstDevice, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyDtoA (dstArray, dstOffset, srcDevice, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoD (dstDevice, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyHtoA (dstArray, dstOffset, srcHost, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoH (dstHost, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyAtoA (dstArray, dstOffset, srcArray, srcOffset, ByteCount) => copy::flat(call, ByteCount as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemcpyHtoDAsync (dstDevice, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyDtoHAsync (dstHost, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyDtoDAsync (dstDevice, srcDevice, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyHtoAAsync (dstArray, dstOffset, srcHost, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemcpyAtoHAsync (dstHost, srcArray, srcOffset, ByteCount, hStream) => copy::flat(call, ByteCount as u64, hStream, DefaultStream::Legacy);
    cuMemsetD8 (dstDevice, uc, N) => copy::flat(call, N as u64, std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D8 (dstDevice, dstPitch, uc, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD16 (dstDevice, us, N) => copy::flat(call, (N as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D16 (dstDevice, dstPitch, us, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(2), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD32 (dstDevice, ui, N) => copy::flat(call, (N as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::Legacy);
    cuMemsetD2D32 (dstDevice, dstPitch, ui, Width, Height) => copy::flat(call, (Width as u64).saturating_mul(Height as u64).saturating_mul(4), std::ptr::null_mut(), DefaultStream::Legacy);
    // CUDA graphs with memory nodes
    cuGraphInstantiateWithFlags (phGraphExec, hGraph, flags) => graph_memory::instantiate(call, phGraphExec, hGraph);
    cuGraphInstantiate (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize) => graph_memory::instantiate(call, phGraphExec, hGraph);
    cuGraphInstantiate_v2 (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize) => graph_memory::instantiate(call, phGraphExec, hGraph);
    cuGraphInstantiateWithParams (phGraphExec, hGraph, instantiateParams) => graph_memory::instantiate(call, phGraphExec, hGraph);
    cuGraphInstantiateWithParams_ptsz (phGraphExec, hGraph, instantiateParams) => graph_memory::instantiate(call, phGraphExec, hGraph);
    cuGraphUpload (hGraphExec, hStream) => graph_memory::upload(call, hGraphExec);
    cuGraphUpload_ptsz (hGraphExec, hStream) => graph_memory::upload(call, hGraphExec);
    cuGraphExecDestroy (hGraphExec) => graph_memory::exec_destroy(call, hGraphExec);
    cuDeviceGraphMemTrim (device) => graph_memory::trim(call, device);
    cuGraphExecUpdate_v2 (hGraphExec, hGraph, resultInfo) => graph_memory::exec_update(call, hGraphExec, hGraph);
    cuGraphExecUpdate (hGraphExec, hGraph, hErrorNode_out, updateResult_out) => graph_memory::exec_update(call, hGraphExec, hGraph);
    cuGraphExecChildGraphNodeSetParams (hGraphExec, hNode, childGraph) => graph_memory::exec_child_update(call, hGraphExec, childGraph);
    cuGraphExecNodeSetParams (hGraphExec, hNode, nodeParams) => graph_memory::exec_node_update(call, hGraphExec, nodeParams);
    cuGraphExecKernelNodeSetParams_v2 (hGraphExec, hNode, nodeParams) => graph_memory::exec_kernel_update(call, hGraphExec);
    cuGraphExecKernelNodeSetParams (hGraphExec, hNode, nodeParams) => graph_memory::exec_kernel_update(call, hGraphExec);
}
