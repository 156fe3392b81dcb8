//! Contexts (cuCtx*, cuDevicePrimaryCtx*).

use std::ffi::c_void;

use super::{alias, cuda_fn, h, hp, out, read};
use crate::context::{self, current_handle};
use crate::objects::with;
use crate::sim::{cuda, Sim};
use crate::types::*;

fn ordinal(sim: &Sim, dev: CUdevice) -> CuResult<usize> {
    sim.phys(dev)?;
    Ok(dev as usize)
}

fn create(pctx: *mut Handle, flags: u32, dev: CUdevice) -> CuResult<()> {
    let sim = cuda()?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = ordinal(sim, dev)?;
    let c = with(|o| context::create(o, sim, d, flags))?;
    // SAFETY: checked non-NULL above; the caller's out-pointer.
    unsafe { out(pctx, hp(c)) }
}

/// Tearing a context down waits for the work queued in it, as a driver does before it frees the context's
/// memory: a kernel never runs on after its context is gone (without the object lock held).
fn drain(c: u64) {
    let t = with(|o| {
        o.contexts
            .contains_key(&c)
            .then(|| crate::stream::ctx_done_time(o, c))
    });
    crate::timeline::sleep_until(t.unwrap_or(0));
}

fn destroy(ctx: Handle) -> CuResult<()> {
    let sim = cuda()?;
    let c = h(ctx);
    if with(|o| o.contexts.get(&c).is_some_and(|x| !x.primary)) {
        drain(c);
    }
    with(|o| context::destroy(o, sim, c))?;
    context::run_destroy_hooks(c);
    Ok(())
}

/// Waits until all work of context `c` (0 = current) is done, then lets pools release memory.
pub(crate) fn synchronize(c: u64) -> CuResult<()> {
    let sim = cuda()?;
    let ctx = loop {
        let t = with(|o| -> CuResult<(Option<u64>, u64)> {
            let c = context::resolve(o, sim, c)?;
            Ok((
                (!crate::stream::ctx_blocked(o, sim, c)).then(|| crate::stream::ctx_done_time(o, c)),
                c,
            ))
        })?;
        match t {
            (Some(t), c) => {
                crate::timeline::sleep_until(t);
                break c;
            }
            // A stream waits for a value: look again soon.
            (None, _) => crate::timeline::sleep_until(crate::timeline::now_ns() + 1_000_000),
        }
    };
    // Work of the context that touched memory it may not fails the synchronisation (sticky).
    with(|o| {
        crate::pool::trim_all_to_threshold(o, sim);
        context::check_fault(o, ctx)
    })
}

cuda_fn! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
        let sim = cuda()?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = ordinal(sim, dev)?;
        out(pctx, hp(with(|o| context::primary_retain(o, sim, d))?))
    }

    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let sim = cuda()?;
        let d = ordinal(sim, dev)?;
        let last = with(|o| -> CuResult<Option<u64>> {
            let c = context::primary_handle(o, sim, d)?;
            Ok((o.primaries[d].refcount == 1).then_some(c))
        })?;
        if let Some(c) = last {
            drain(c);
        }
        if let Some(c) = with(|o| context::primary_release(o, sim, d))? {
            context::run_destroy_hooks(c);
        }
        Ok(())
    }

    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let sim = cuda()?;
        let d = ordinal(sim, dev)?;
        drain(with(|o| context::primary_handle(o, sim, d))?);
        let c = with(|o| context::primary_reset(o, sim, d))?;
        context::run_destroy_hooks(c);
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut u32, active: *mut i32) {
        let sim = cuda()?;
        let d = ordinal(sim, dev)?;
        if flags.is_null() || active.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (f, a) = with(|o| -> CuResult<(u32, bool)> {
            let c = context::primary_handle(o, sim, d)?;
            Ok((o.primaries[d].flags, o.contexts[&c].active))
        })?;
        out(flags, f)?;
        out(active, a as i32)
    }

    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32) {
        let sim = cuda()?;
        let d = ordinal(sim, dev)?;
        if flags & !0xff != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            let c = context::primary_handle(o, sim, d)?;
            o.primaries[d].flags = flags;
            if let Some(ctx) = o.contexts.get_mut(&c) {
                ctx.flags = flags;
            }
            Ok(())
        })
    }

    fn cuCtxCreate(pctx: *mut Handle, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v2(pctx: *mut Handle, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v3(pctx: *mut Handle, params: *mut c_void, num_params: i32, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v4(pctx: *mut Handle, params: *mut CtxCreateParams, flags: u32, dev: CUdevice) {
        if !params.is_null() {
            let p = read(params)?;
            if !p.exec_affinity_params.is_null() && !p.cig_params.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        create(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: Handle) {
        destroy(ctx)
    }

    fn cuCtxDestroy_v2(ctx: Handle) {
        destroy(ctx)
    }

    fn cuCtxGetCurrent(pctx: *mut Handle) {
        cuda()?;
        out(pctx, hp(current_handle()))
    }

    fn cuCtxSetCurrent(ctx: Handle) {
        let sim = cuda()?;
        let c = h(ctx);
        if c != 0 {
            with(|o| o.contexts.contains_key(&c)).then_some(()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        }
        context::set_current(c);
        Ok(())
    }

    fn cuCtxPushCurrent_v2(ctx: Handle) {
        cuda()?;
        let c = h(ctx);
        if c == 0 || !with(|o| o.contexts.contains_key(&c)) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        context::push(c);
        Ok(())
    }

    fn cuCtxPopCurrent_v2(pctx: *mut Handle) {
        cuda()?;
        if current_handle() == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        let c = context::pop();
        if !pctx.is_null() {
            out(pctx, hp(c))?;
        }
        Ok(())
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let sim = cuda()?;
        if dev.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (d, _) = with(|o| -> CuResult<(usize, usize)> {
            let c = context::current(o, sim)?;
            context::device_of(o, c)
        })?;
        out(dev, d as CUdevice)
    }

    fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: Handle) {
        let sim = cuda()?;
        if dev.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (d, _) = with(|o| -> CuResult<(usize, usize)> {
            let c = context::resolve(o, sim, h(ctx))?;
            context::device_of(o, c)
        })?;
        out(dev, d as CUdevice)
    }

    fn cuCtxSynchronize() {
        synchronize(0)
    }

    fn cuCtxSynchronize_v2(ctx: Handle) {
        synchronize(h(ctx))
    }

    fn cuCtxGetApiVersion(ctx: Handle, version: *mut u32) {
        let sim = cuda()?;
        with(|o| context::resolve(o, sim, h(ctx)))?;
        out(version, 3020)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        let sim = cuda()?;
        let f = with(|o| -> CuResult<u32> {
            let c = context::current(o, sim)?;
            Ok(o.contexts[&c].flags)
        })?;
        out(flags, f)
    }

    fn cuCtxSetFlags(flags: u32) {
        let sim = cuda()?;
        with(|o| -> CuResult<()> {
            let c = context::current(o, sim)?;
            if let Some(ctx) = o.contexts.get_mut(&c) {
                ctx.flags = flags;
            }
            Ok(())
        })
    }

    fn cuCtxGetId(ctx: Handle, id: *mut u64) {
        let sim = cuda()?;
        let c = with(|o| context::resolve(o, sim, h(ctx)))?;
        out(id, (c >> 4) & 0xffff_ffff)
    }

    fn cuCtxGetLimit(value: *mut usize, limit: u32) {
        let sim = cuda()?;
        with(|o| context::current(o, sim))?;
        let v = match limit {
            // STACK_SIZE, PRINTF_FIFO_SIZE, MALLOC_HEAP_SIZE, DEV_RUNTIME_SYNC_DEPTH,
            // DEV_RUNTIME_PENDING_LAUNCH_COUNT: as set (all but the sync depth reserve device memory)
            0..=4 => with(|o| context::memory_limit(o, sim, limit as usize))?,
            5 => 64,               // MAX_L2_FETCH_GRANULARITY
            6 => 0,                // PERSISTING_L2_CACHE_SIZE
            7 => 227 * 1024,       // SHMEM_SIZE
            8 | 9 => 0,            // CIG
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    }

    fn cuCtxSetLimit(limit: u32, value: usize) {
        let sim = cuda()?;
        with(|o| context::current(o, sim))?;
        match limit {
            0..=4 => with(|o| context::set_memory_limit(o, sim, limit as usize, value)),
            // SHMEM_SIZE and CIG_ENABLED can only be queried.
            7 | 8 => Err(CUDA_ERROR_INVALID_VALUE),
            5..=9 => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuCtxGetCacheConfig(config: *mut u32) {
        cuda()?;
        out(config, 0)
    }

    fn cuCtxSetCacheConfig(config: u32) {
        cuda()?;
        Ok(())
    }

    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        cuda()?;
        if !least.is_null() {
            out(least, 0)?;
        }
        if !greatest.is_null() {
            out(greatest, -5)?;
        }
        Ok(())
    }

    fn cuCtxResetPersistingL2Cache() {
        cuda()?;
        Ok(())
    }
}

alias! {
    cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset_v2(dev: CUdevice);
    cuDevicePrimaryCtxSetFlags => cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32);
    cuCtxPushCurrent => cuCtxPushCurrent_v2(ctx: Handle);
    cuCtxPopCurrent => cuCtxPopCurrent_v2(pctx: *mut Handle);
}
