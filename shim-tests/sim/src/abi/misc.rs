//! Smaller driver functions programs and the CUDA runtime commonly call: host callbacks, host registration,
//! peer access, stream attributes, occupancy, managed-memory hints, enumeration.

use std::ffi::c_void;

use super::{alias, cuda_fn, h, hp, out};
use crate::context;
use crate::objects::with;
use crate::sim::cuda;
use crate::stream;
use crate::timeline::sleep_until;
use crate::types::*;

type HostFn = unsafe extern "C" fn(*mut c_void);
type StreamCallback = unsafe extern "C" fn(Handle, CUresult, *mut c_void);

/// Runs `f` on a helper thread once the work queued so far on `s` is done (host callbacks run in order
/// after the stream's preceding work; the caller does not wait).
fn after_stream(s: Handle, f: impl FnOnce() + Send + 'static) -> CuResult<()> {
    let sim = cuda()?;
    let t = with(|o| -> CuResult<u64> {
        let st = stream::resolve(o, sim, h(s))?;
        stream::check_not_capturing(o, st)?;
        Ok(stream::done_time(o, st))
    })?;
    std::thread::Builder::new()
        .name("cudasim-callback".into())
        .spawn(move || {
            sleep_until(t);
            crate::touch::after_wait();
            f();
        })
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok(())
}

/// cuMemHostRegister: the range becomes pinned host memory the device can address.
fn host_register(p: *mut c_void, bytes: usize, flags: u32) -> CuResult<()> {
    cuda()?;
    if p.is_null() || bytes == 0 || flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with(|o| {
        if o.mem.find_host(p as u64).is_some() {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        o.mem.registered.insert(p as u64, bytes as u64);
        Ok(())
    })
}

fn occupancy_block(min_grid: *mut i32, block: *mut i32, f: Handle, limit: i32) -> CuResult<()> {
    let sim = cuda()?;
    let sms = with(|o| -> CuResult<u32> {
        if !o.functions.contains_key(&h(f)) && !o.kernels.contains_key(&h(f)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let c = context::current(o, sim)?;
        Ok(sim.cfg.devices[context::device_of(o, c)?.1].sms)
    })?;
    let b = if limit > 0 { limit.min(1024) } else { 1024 };
    // SAFETY: the caller's out-pointers (NULL-checked by `out`).
    unsafe {
        out(block, b)?;
        out(min_grid, (sms as i32) * (2048 / b).max(1))
    }
}

cuda_fn! {
    // No profiling tool is attached to the simulator: start / stop only check there is a current context
    // (CUDA_ERROR_INVALID_CONTEXT otherwise, as cudaProfiler.h documents) and otherwise have no effect.
    fn cuProfilerStart() {
        let sim = cuda()?;
        with(|o| context::current(o, sim)).map(|_| ())
    }

    fn cuProfilerStop() {
        let sim = cuda()?;
        with(|o| context::current(o, sim)).map(|_| ())
    }

    fn cuLaunchHostFunc(s: Handle, f: Option<HostFn>, user: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let user = user as usize;
        // SAFETY: the program's callback with its own argument, as the API promises to call it.
        after_stream(s, move || unsafe { f(user as *mut c_void) })
    }

    fn cuStreamAddCallback(s: Handle, cb: Option<StreamCallback>, user: *mut c_void, flags: u32) {
        let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (user, sh) = (user as usize, s as usize);
        // SAFETY: the program's callback with the stream, a success status and its argument.
        after_stream(s, move || unsafe { cb(sh as Handle, CUDA_SUCCESS, user as *mut c_void) })
    }

    fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: u32) {
        host_register(p, bytes, flags)
    }

    fn cuMemHostRegister(p: *mut c_void, bytes: usize, flags: u32) {
        host_register(p, bytes, flags)
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        cuda()?;
        with(|o| o.mem.registered.remove(&(p as u64)).map(|_| ()).ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED))
    }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        cuda()?;
        if mode.is_null() || *mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    fn cuCtxEnablePeerAccess(peer: Handle, flags: u32) {
        let sim = cuda()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            context::current(o, sim)?;
            context::resolve(o, sim, h(peer)).map(|_| ())
        })
    }

    fn cuCtxDisablePeerAccess(peer: Handle) {
        let sim = cuda()?;
        with(|o| context::resolve(o, sim, h(peer)).map(|_| ()))
    }

    fn cuDeviceGetP2PAttribute(value: *mut i32, attrib: u32, src: CUdevice, dst: CUdevice) {
        let sim = cuda()?;
        sim.phys(src)?;
        sim.phys(dst)?;
        if src == dst {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        out(value, 0)
    }

    fn cuStreamGetAttribute(s: Handle, attr: u32, value: *mut c_void) {
        let sim = cuda()?;
        with(|o| stream::resolve(o, sim, h(s)))?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // CUstreamAttrValue is a 64-byte union: every attribute reads as its default (0).
        std::ptr::write_bytes(value as *mut u8, 0, 64);
        Ok(())
    }

    fn cuStreamSetAttribute(s: Handle, attr: u32, value: *const c_void) {
        let sim = cuda()?;
        with(|o| stream::resolve(o, sim, h(s)))?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    fn cuStreamCopyAttributes(dst: Handle, src: Handle) {
        let sim = cuda()?;
        with(|o| -> CuResult<()> {
            stream::resolve(o, sim, h(dst))?;
            stream::resolve(o, sim, h(src)).map(|_| ())
        })
    }

    fn cuStreamGetCtx_v2(s: Handle, pctx: *mut Handle, green: *mut Handle) {
        let sim = cuda()?;
        let c = with(|o| -> CuResult<u64> {
            let st = stream::resolve(o, sim, h(s))?;
            Ok(o.streams[&st].ctx)
        })?;
        if !green.is_null() {
            *green = std::ptr::null_mut();
        }
        out(pctx, hp(c))
    }

    fn cuOccupancyMaxPotentialBlockSize(
        min_grid: *mut i32,
        block: *mut i32,
        f: Handle,
        smem_fn: *mut c_void,
        dyn_smem: usize,
        limit: i32,
    ) {
        occupancy_block(min_grid, block, f, limit)
    }

    fn cuOccupancyMaxPotentialBlockSizeWithFlags(
        min_grid: *mut i32,
        block: *mut i32,
        f: Handle,
        smem_fn: *mut c_void,
        dyn_smem: usize,
        limit: i32,
        flags: u32,
    ) {
        occupancy_block(min_grid, block, f, limit)
    }

    fn cuMemPrefetchAsync(p: u64, n: usize, dev: CUdevice, s: Handle) {
        let sim = cuda()?;
        with(|o| stream::resolve(o, sim, h(s)).map(|_| ()))
    }

    fn cuMemPrefetchAsync_v2(p: u64, n: usize, loc: MemLocation, flags: u32, s: Handle) {
        let sim = cuda()?;
        with(|o| stream::resolve(o, sim, h(s)).map(|_| ()))
    }

    fn cuMemAdvise(p: u64, n: usize, advice: u32, dev: CUdevice) {
        cuda()?;
        with(|o| o.mem.find(p).is_some()).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuMemAdvise_v2(p: u64, n: usize, advice: u32, loc: MemLocation) {
        cuda()?;
        with(|o| o.mem.find(p).is_some()).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuModuleGetFunctionCount(count: *mut u32, m: Handle) {
        cuda()?;
        let n = with(|o| o.modules.get(&h(m)).map(|m| m.image.kernel_count() as u32)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(count, n)
    }

    fn cuLibraryGetKernelCount(count: *mut u32, l: Handle) {
        cuda()?;
        let n =
            with(|o| o.libraries.get(&h(l)).map(|l| l.image.kernel_count() as u32)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(count, n)
    }

    fn cuDeviceGetExecAffinitySupport(pi: *mut i32, ty: u32, dev: CUdevice) {
        cuda()?.phys(dev)?;
        out(pi, 0)
    }

    fn cuCtxGetSharedMemConfig(config: *mut u32) {
        cuda()?;
        out(config, 0)
    }

    fn cuFuncIsLoaded(state: *mut u32, f: Handle) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(state, 1) // CU_FUNCTION_LOADING_STATE_LOADED
    }

    fn cuFuncLoad(f: Handle) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

alias! {
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(s: Handle, f: Option<HostFn>, user: *mut c_void);
    cuStreamAddCallback_ptsz => cuStreamAddCallback(s: Handle, cb: Option<StreamCallback>, user: *mut c_void, flags: u32);
    cuStreamGetAttribute_ptsz => cuStreamGetAttribute(s: Handle, attr: u32, value: *mut c_void);
    cuStreamSetAttribute_ptsz => cuStreamSetAttribute(s: Handle, attr: u32, value: *const c_void);
    cuStreamCopyAttributes_ptsz => cuStreamCopyAttributes(dst: Handle, src: Handle);
    cuStreamGetCtx_v2_ptsz => cuStreamGetCtx_v2(s: Handle, pctx: *mut Handle, green: *mut Handle);
    cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync(p: u64, n: usize, dev: CUdevice, s: Handle);
    cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync_v2(p: u64, n: usize, loc: MemLocation, flags: u32, s: Handle);
}
