//! The driver queries memory's families ask, behind one trait (as the throttle's `Gpu`): the real table in
//! the shim, a fake in unit tests. The stack's pricing (`stack`) and graphs (`graphs`: the walk, the graph
//! pools' reserved size) go through it; stream-ordered pools (`pools`: reserved and used sizes, the devices' pools), imports (`interprocess`: their device and size) and the records of a dead context (`allocs::freed_by`: where an allocation starts) too; the other families' queries still take the `CudaTable`.
//! NVML's process lists, which overhead's measurement and the host pid read, are behind [`Processes`].

use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::ffi::nvml::nvmlProcessInfo_v2_t;
use std::ffi::c_int;

/// What overhead's measurement and the host pid ask NVML (the real library in the shim, a fake in tests).
pub(crate) trait Processes {
    /// The processes NVML lists on the device with this UUID; `None`: NVML cannot tell.
    fn processes(&self, uuid: &[u8; 16]) -> Option<Vec<nvmlProcessInfo_v2_t>>;
}

impl Processes for Nvml {
    fn processes(&self, uuid: &[u8; 16]) -> Option<Vec<nvmlProcessInfo_v2_t>> {
        Nvml::processes(self, uuid)
    }
}

/// What pricing asks the driver. Each answer is the driver's, or its error.
pub(crate) trait Driver {
    /// `cuDeviceGetAttribute` of device `ordinal`.
    fn device_attribute(&self, attr: CUdevice_attribute, ordinal: CUdevice) -> Result<c_int, CUresult>;
    /// `cuFuncGetAttribute`'s `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` of `f` (a `CUfunction`).
    fn function_local_size(&self, f: CUfunction) -> Result<c_int, CUresult>;
    /// `cuKernelGetAttribute`'s `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` of `f` (a `CUkernel`) on device `ordinal`.
    fn kernel_local_size(&self, f: CUfunction, ordinal: CUdevice) -> Result<c_int, CUresult>;
    /// `cuCtxGetLimit(CU_LIMIT_STACK_SIZE)` of the current context.
    fn stack_size(&self) -> Result<usize, CUresult>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> Result<c_int, CUresult>;
    /// `cuGraphGetNodes`: the nodes of `graph`.
    fn graph_nodes(&self, graph: CUgraph) -> Result<Vec<CUgraphNode>, CUresult>;
    /// `cuGraphNodeGetType`.
    fn node_type(&self, node: CUgraphNode) -> Result<CUgraphNodeType, CUresult>;
    /// `cuGraphChildGraphNodeGetGraph`: the graph a child graph node holds.
    fn child_graph(&self, node: CUgraphNode) -> Result<CUgraph, CUresult>;
    /// `cuGraphMemAllocNodeGetParams`: where an alloc node allocates (`None`: not on a device) and how much.
    fn alloc_node(&self, node: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult>;
    /// `cuGraphKernelNodeGetParams` (`_v2`, else the v1 form): the function and the library kernel (when the
    /// function is NULL) a kernel node runs.
    fn kernel_node(&self, node: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult>;
    /// `cuDeviceGetGraphMemAttribute` of device `ordinal` (a `cuuint64_t` attribute).
    fn graph_mem_attribute(&self, ordinal: CUdevice, attr: CUgraphMem_attribute) -> Result<u64, CUresult>;
    /// `cuMemPoolGetAttribute` of `pool` (a `CUmemoryPool`; a `cuuint64_t` attribute).
    fn pool_attribute(&self, _pool: usize, _attr: CUmemPool_attribute) -> Result<u64, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuDeviceGetMemPool`: device `ordinal`'s current pool.
    fn mem_pool(&self, _ordinal: CUdevice) -> Result<usize, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuDeviceGetDefaultMemPool`: device `ordinal`'s default pool.
    fn default_mem_pool(&self, _ordinal: CUdevice) -> Result<usize, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)`: the device of the memory at `p`.
    fn pointer_device(&self, _p: u64) -> Result<c_int, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemGetAddressRange`: the size of the allocation at `p`.
    fn address_size(&self, _p: u64) -> Result<usize, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)`: where the allocation holding `p` starts.
    fn range_start(&self, _p: u64) -> Result<u64, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }

    // ---- what elastic memory (`elastic`) moves with; every call in the context current on this thread;
    // the other families' fakes keep the refusing defaults ----

    /// `cuCtxGetCurrent`.
    fn current_context(&self) -> Result<CUcontext, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// Runs `f` with `ctx` current (pushed and popped when another one is); `Err` when it cannot be made current.
    fn in_context(&self, _ctx: CUcontext, _f: &mut dyn FnMut()) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemAddressReserve` of `size` bytes anywhere.
    fn reserve(&self, _size: u64) -> Result<CUdeviceptr, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemAddressFree`.
    fn address_free(&self, _ptr: CUdeviceptr, _size: u64) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemCreate` of `size` pinned bytes on device `Some(ordinal)`, or in host memory (`None`).
    fn create(&self, _size: u64, _on: Option<CUdevice>) -> Result<CUmemGenericAllocationHandle, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemRelease`.
    fn release(&self, _h: CUmemGenericAllocationHandle) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemMap` of all of `h` at `ptr`.
    fn map(&self, _ptr: CUdeviceptr, _size: u64, _h: CUmemGenericAllocationHandle) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemUnmap`.
    fn unmap(&self, _ptr: CUdeviceptr, _size: u64) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemSetAccess`: read-write for each of `devices` (one descriptor each).
    fn set_access(&self, _ptr: CUdeviceptr, _size: u64, _devices: &[CUdevice]) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuDeviceCanAccessPeer(dev, peer)`: whether device `dev` can access memory on device `peer`.
    fn can_access_peer(&self, _dev: CUdevice, _peer: CUdevice) -> Result<bool, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamCreate(CU_STREAM_NON_BLOCKING)`.
    fn stream_create(&self) -> Result<CUstream, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuMemcpyAsync` on `stream`, then `cuStreamSynchronize` of it (the library's own stream).
    fn copy(&self, _dst: CUdeviceptr, _src: CUdeviceptr, _n: u64, _stream: CUstream) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamQuery`: `Ok(true)` idle, `Ok(false)` busy (`CUDA_ERROR_NOT_READY`).
    fn stream_idle(&self, _stream: CUstream) -> Result<bool, CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
    /// `cuCtxSynchronize` (what `cuMemFree` does before the memory goes).
    fn synchronize(&self) -> Result<(), CUresult> {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
}

fn answer<T>(r: CUresult, v: T) -> Result<T, CUresult> {
    if r.ok() {
        Ok(v)
    } else {
        Err(r)
    }
}

impl Driver for CudaTable {
    fn device_attribute(&self, attr: CUdevice_attribute, ordinal: CUdevice) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetAttribute(&mut n, attr, ordinal) };
        answer(r, n)
    }

    fn function_local_size(&self, f: CUfunction) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; `f` is the program's handle, which the driver checks.
        let r = unsafe { self.cuFuncGetAttribute(&mut n, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) };
        answer(r, n)
    }

    fn kernel_local_size(&self, f: CUfunction, ordinal: CUdevice) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: as above.
        let r = unsafe { self.cuKernelGetAttribute(&mut n, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f, ordinal) };
        answer(r, n)
    }

    fn stack_size(&self) -> Result<usize, CUresult> {
        let mut n: usize = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuCtxGetLimit(&mut n, CU_LIMIT_STACK_SIZE) };
        answer(r, n)
    }

    fn device_count(&self) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetCount(&mut n) };
        answer(r, n)
    }

    fn graph_nodes(&self, graph: CUgraph) -> Result<Vec<CUgraphNode>, CUresult> {
        let mut n: usize = 0;
        // SAFETY: valid out-pointer; a NULL node array asks for the count.
        let r = unsafe { self.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) };
        answer(r, ())?;
        let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
        if n > 0 {
            // SAFETY: `nodes` holds `n` entries.
            let r = unsafe { self.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) };
            answer(r, ())?;
            nodes.truncate(n);
        }
        Ok(nodes)
    }

    fn node_type(&self, node: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuGraphNodeGetType(node, &mut ty) };
        answer(r, ty)
    }

    fn child_graph(&self, node: CUgraphNode) -> Result<CUgraph, CUresult> {
        let mut g: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuGraphChildGraphNodeGetGraph(node, &mut g) };
        answer(r, g)
    }

    fn alloc_node(&self, node: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult> {
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer of the parameter struct.
        let r = unsafe { self.cuGraphMemAllocNodeGetParams(node, &mut p) };
        let loc = p.poolProps.location;
        let dev = (loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE).then_some(loc.id);
        answer(r, (dev, p.bytesize as u64))
    }

    fn kernel_node(&self, node: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult> {
        // SAFETY: zeroed is a valid value of these plain C structs.
        let mut p: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer of the v2 parameter struct.
        match unsafe { self.cuGraphKernelNodeGetParams_v2(node, &mut p) } {
            // A driver older than CUDA 12.0: the v1 form (no library kernels then).
            CUresult::ERROR_NOT_FOUND => {
                // SAFETY: as above.
                let mut p1: CUDA_KERNEL_NODE_PARAMS_v1 = unsafe { std::mem::zeroed() };
                // SAFETY: valid out-pointer of the v1 parameter struct.
                let r = unsafe { self.cuGraphKernelNodeGetParams(node, &mut p1) };
                answer(r, (p1.func, std::ptr::null_mut()))
            }
            r => answer(r, (p.func, p.kern)),
        }
    }

    fn graph_mem_attribute(&self, ordinal: CUdevice, attr: CUgraphMem_attribute) -> Result<u64, CUresult> {
        let mut v: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
        let r = unsafe { self.cuDeviceGetGraphMemAttribute(ordinal, attr, (&mut v as *mut u64).cast()) };
        answer(r, v)
    }

    fn pool_attribute(&self, pool: usize, attr: CUmemPool_attribute) -> Result<u64, CUresult> {
        let mut v: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t); the driver checks the handle.
        let r =
            unsafe { self.cuMemPoolGetAttribute(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast()) };
        answer(r, v)
    }

    fn mem_pool(&self, ordinal: CUdevice) -> Result<usize, CUresult> {
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetMemPool(&mut pool, ordinal) };
        answer(r, pool as usize)
    }

    fn default_mem_pool(&self, ordinal: CUdevice) -> Result<usize, CUresult> {
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetDefaultMemPool(&mut pool, ordinal) };
        answer(r, pool as usize)
    }

    fn pointer_device(&self, p: u64) -> Result<c_int, CUresult> {
        let mut ordinal: c_int = -1;
        // SAFETY: valid out-pointer of the attribute's type (int); the driver checks `p`.
        let r = unsafe {
            self.cuPointerGetAttribute(
                (&mut ordinal as *mut c_int).cast(),
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                p,
            )
        };
        answer(r, ordinal)
    }

    fn address_size(&self, p: u64) -> Result<usize, CUresult> {
        let (mut base, mut size) = (0, 0usize);
        // SAFETY: valid out-pointers; the driver checks `p`.
        let r = unsafe { self.cuMemGetAddressRange_v2(&mut base, &mut size, p) };
        answer(r, size)
    }

    fn range_start(&self, p: u64) -> Result<u64, CUresult> {
        let mut start: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (CUdeviceptr); the driver checks `p`.
        let r = unsafe {
            self.cuPointerGetAttribute(
                (&mut start as *mut u64).cast(),
                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                p,
            )
        };
        answer(r, start)
    }

    fn current_context(&self) -> Result<CUcontext, CUresult> {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuCtxGetCurrent(&mut c) };
        answer(r, c)
    }

    fn in_context(&self, ctx: CUcontext, f: &mut dyn FnMut()) -> Result<(), CUresult> {
        crate::driver::cuda::in_context(self, ctx, f).ok_or(CUresult::ERROR_INVALID_CONTEXT)
    }

    fn reserve(&self, size: u64) -> Result<CUdeviceptr, CUresult> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address asked.
        let r = unsafe { self.cuMemAddressReserve(&mut p, size as usize, 0, 0, 0) };
        answer(r, p)
    }

    fn address_free(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CUresult> {
        // SAFETY: a range this library reserved.
        answer(unsafe { self.cuMemAddressFree(ptr, size as usize) }, ())
    }

    fn create(&self, size: u64, on: Option<CUdevice>) -> Result<CUmemGenericAllocationHandle, CUresult> {
        let location = match on {
            Some(ordinal) => CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            None => CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
        };
        let prop = CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: 0,
            location,
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocFlags::default(),
        };
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct.
        let r = unsafe { self.cuMemCreate(&mut h, size as usize, &prop, 0) };
        answer(r, h)
    }

    fn release(&self, h: CUmemGenericAllocationHandle) -> Result<(), CUresult> {
        // SAFETY: a handle this library created.
        answer(unsafe { self.cuMemRelease(h) }, ())
    }

    fn map(&self, ptr: CUdeviceptr, size: u64, h: CUmemGenericAllocationHandle) -> Result<(), CUresult> {
        // SAFETY: a range and a handle this library owns.
        answer(unsafe { self.cuMemMap(ptr, size as usize, 0, h, 0) }, ())
    }

    fn unmap(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CUresult> {
        // SAFETY: a range this library mapped.
        answer(unsafe { self.cuMemUnmap(ptr, size as usize) }, ())
    }

    fn set_access(&self, ptr: CUdeviceptr, size: u64, devices: &[CUdevice]) -> Result<(), CUresult> {
        let d: Vec<CUmemAccessDesc> = devices
            .iter()
            .map(|&id| CUmemAccessDesc {
                location: CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: `d.len()` valid descriptors.
        answer(
            unsafe { self.cuMemSetAccess(ptr, size as usize, d.as_ptr(), d.len()) },
            (),
        )
    }

    fn can_access_peer(&self, dev: CUdevice, peer: CUdevice) -> Result<bool, CUresult> {
        let mut can: c_int = 0;
        // SAFETY: valid out-pointer; the driver checks the ordinals.
        let r = unsafe { self.cuDeviceCanAccessPeer(&mut can, dev, peer) };
        answer(r, can != 0)
    }

    fn stream_create(&self) -> Result<CUstream, CUresult> {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuStreamCreate(&mut s, CU_STREAM_NON_BLOCKING) };
        answer(r, s)
    }

    fn copy(&self, dst: CUdeviceptr, src: CUdeviceptr, n: u64, stream: CUstream) -> Result<(), CUresult> {
        // SAFETY: ranges this library mapped; the library's own stream.
        answer(unsafe { self.cuMemcpyAsync(dst, src, n as usize, stream) }, ())?;
        // SAFETY: as above.
        answer(unsafe { self.cuStreamSynchronize(stream) }, ())
    }

    fn stream_idle(&self, stream: CUstream) -> Result<bool, CUresult> {
        // SAFETY: a stream the program used; the driver checks the handle.
        match unsafe { self.cuStreamQuery(stream) } {
            CUresult::SUCCESS => Ok(true),
            CUresult::ERROR_NOT_READY => Ok(false),
            r => Err(r),
        }
    }

    fn synchronize(&self) -> Result<(), CUresult> {
        // SAFETY: no arguments.
        answer(unsafe { self.cuCtxSynchronize() }, ())
    }
}

/// A driver for the families' unit tests (queries and elastic memory's moves).
#[cfg(test)]
pub(super) mod fake;
