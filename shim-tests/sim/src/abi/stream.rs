//! Streams and events (cuStream*, cuEvent*).

use super::{alias, cuda_fn, h, hp, out};
use crate::context;
use crate::objects::with;
use crate::pool;
use crate::sim::cuda;
use crate::stream::{self, Capture};
use crate::timeline::{now_ns, sleep_until};
use crate::types::*;

fn create(ps: *mut Handle, flags: u32, priority: i32) -> CuResult<()> {
    let sim = cuda()?;
    if ps.is_null() || flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = with(|o| -> CuResult<u64> {
        let c = context::current(o, sim)?;
        Ok(stream::create(o, c, flags, priority.clamp(-5, 0)))
    })?;
    // SAFETY: checked non-NULL.
    unsafe { out(ps, hp(s)) }
}

fn destroy(s: Handle) -> CuResult<()> {
    cuda()?;
    with(|o| stream::destroy(o, h(s)))
}

fn synchronize(s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    let ctx = loop {
        let t = with(|o| -> CuResult<(Option<u64>, u64)> {
            let s = stream::resolve(o, sim, h(s))?;
            stream::check_not_capturing(o, s)?;
            let ctx = o.streams[&s].ctx;
            Ok((
                (!stream::blocked(o, sim, s)).then(|| stream::done_time(o, s)),
                ctx,
            ))
        })?;
        match t {
            (Some(t), ctx) => {
                sleep_until(t);
                break ctx;
            }
            // Behind a wait for a value: look again soon.
            (None, _) => sleep_until(now_ns() + 1_000_000),
        }
    };
    // A kernel or copy of the stream's that touched memory it may not fails the synchronisation.
    with(|o| {
        pool::trim_all_to_threshold(o, sim);
        crate::context::check_fault(o, ctx)
    })
}

fn event_destroy(e: Handle) -> CuResult<()> {
    cuda()?;
    with(|o| {
        o.events
            .remove(&h(e))
            .map(|e| crate::ipc::event_destroyed(&e))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

fn record(e: Handle, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    with(|o| {
        let st = stream::resolve(o, sim, h(s))?;
        stream::event_record(o, h(e), st)?;
        stream::event_at_device_position(o, sim, h(e), st);
        Ok(())
    })
}

fn elapsed(ms: *mut f32, start: Handle, end: Handle) -> CuResult<()> {
    cuda()?;
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let v = with(|o| stream::elapsed_ms(o, h(start), h(end)))?;
    // SAFETY: checked non-NULL.
    unsafe { out(ms, v) }
}

fn begin_capture(s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    with(|o| {
        let st = stream::resolve(o, sim, h(s))?;
        if o.streams[&st].is_null {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if o.streams[&st].capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let graph = crate::graph::create(o);
        let id = crate::objects::new_handle(crate::objects::Kind::Graph) >> 4;
        if let Some(x) = o.streams.get_mut(&st) {
            x.capture = Some(Capture {
                graph,
                last_node: None,
                id,
            });
        }
        Ok(())
    })
}

fn capture_info(s: Handle, status: *mut u32, id: *mut u64, graph: *mut Handle) -> CuResult<()> {
    let sim = cuda()?;
    let (st, i, g) = with(|o| -> CuResult<(u32, u64, u64)> {
        let s = stream::resolve(o, sim, h(s))?;
        Ok(match &o.streams[&s].capture {
            Some(c) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, c.id, c.graph),
            None => (CU_STREAM_CAPTURE_STATUS_NONE, 0, 0),
        })
    })?;
    // SAFETY: out-pointers other than the status are optional per the API.
    unsafe {
        out(status, st)?;
        if !id.is_null() {
            *id = i;
        }
        if !graph.is_null() {
            *graph = hp(g);
        }
    }
    Ok(())
}

/// cuStreamWaitValue32/64 (and `_v2`): later work on `s` waits for the value.
fn wait_value(s: Handle, addr: u64, value: u64, flags: u32, wide: bool) -> CuResult<()> {
    let sim = cuda()?;
    with(|o| {
        let s = stream::resolve(o, sim, h(s))?;
        stream::check_not_capturing(o, s)?;
        stream::wait_value(o, s, addr, value, flags, wide)
    })
}

/// cuStreamWriteValue32/64 (and `_v2`): the value is written once the stream's earlier work is done (the
/// calling thread waits for that here: a simplification; the write itself is what a wait sees).
fn write_value(s: Handle, addr: u64, value: u64, wide: bool) -> CuResult<()> {
    synchronize(s)?;
    with(|o| {
        if !stream::word(o, addr, wide, true) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: inside a live allocation of simulated device memory (host memory) or a read-write VMM mapping
        // (checked under the objects' lock, which every remap takes), aligned.
        unsafe {
            if wide {
                std::ptr::write_volatile(addr as *mut u64, value)
            } else {
                std::ptr::write_volatile(addr as *mut u32, value as u32)
            }
        }
        Ok(())
    })
}

cuda_fn! {
    fn cuStreamWaitValue32(s: Handle, addr: u64, value: u32, flags: u32) {
        wait_value(s, addr, value as u64, flags, false)
    }

    fn cuStreamWaitValue64(s: Handle, addr: u64, value: u64, flags: u32) {
        wait_value(s, addr, value, flags, true)
    }

    fn cuStreamWriteValue32(s: Handle, addr: u64, value: u32, flags: u32) {
        let _ = flags;
        write_value(s, addr, value as u64, false)
    }

    fn cuStreamWriteValue64(s: Handle, addr: u64, value: u64, flags: u32) {
        let _ = flags;
        write_value(s, addr, value, true)
    }

    fn cuStreamCreate(ps: *mut Handle, flags: u32) {
        create(ps, flags, 0)
    }

    fn cuStreamCreateWithPriority(ps: *mut Handle, flags: u32, priority: i32) {
        create(ps, flags, priority)
    }

    fn cuStreamDestroy_v2(s: Handle) {
        destroy(s)
    }

    fn cuStreamDestroy(s: Handle) {
        destroy(s)
    }

    fn cuStreamSynchronize(s: Handle) {
        synchronize(s)
    }

    fn cuStreamQuery(s: Handle) {
        let sim = cuda()?;
        let t = with(|o| -> CuResult<u64> {
            let s = stream::resolve(o, sim, h(s))?;
            Ok(if stream::blocked(o, sim, s) { u64::MAX } else { stream::done_time(o, s) })
        })?;
        if t > now_ns() {
            Err(CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    }

    fn cuStreamWaitEvent(s: Handle, e: Handle, flags: u32) {
        let sim = cuda()?;
        with(|o| {
            let st = stream::resolve(o, sim, h(s))?;
            stream::wait_event(o, st, h(e))
        })
    }

    fn cuStreamGetPriority(s: Handle, priority: *mut i32) {
        let sim = cuda()?;
        let p = with(|o| -> CuResult<i32> {
            let s = stream::resolve(o, sim, h(s))?;
            Ok(o.streams[&s].priority)
        })?;
        out(priority, p)
    }

    fn cuStreamGetFlags(s: Handle, flags: *mut u32) {
        let sim = cuda()?;
        let f = with(|o| -> CuResult<u32> {
            let s = stream::resolve(o, sim, h(s))?;
            Ok(o.streams[&s].flags)
        })?;
        out(flags, f)
    }

    fn cuStreamGetCtx(s: Handle, pctx: *mut Handle) {
        let sim = cuda()?;
        let c = with(|o| -> CuResult<u64> {
            let s = stream::resolve(o, sim, h(s))?;
            Ok(o.streams[&s].ctx)
        })?;
        out(pctx, hp(c))
    }

    fn cuStreamGetId(s: Handle, id: *mut u64) {
        let sim = cuda()?;
        let v = with(|o| stream::resolve(o, sim, h(s)))?;
        out(id, v >> 4)
    }

    fn cuStreamGetDevice(s: Handle, dev: *mut CUdevice) {
        let sim = cuda()?;
        let d = with(|o| -> CuResult<usize> {
            let s = stream::resolve(o, sim, h(s))?;
            Ok(context::device_of(o, o.streams[&s].ctx)?.0)
        })?;
        out(dev, d as CUdevice)
    }

    fn cuStreamBeginCapture_v2(s: Handle, mode: u32) {
        if mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        begin_capture(s)
    }

    fn cuStreamBeginCapture(s: Handle) {
        begin_capture(s)
    }

    fn cuStreamEndCapture(s: Handle, graph: *mut Handle) {
        let sim = cuda()?;
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = with(|o| -> CuResult<u64> {
            let st = stream::resolve(o, sim, h(s))?;
            let c = o.streams.get_mut(&st).and_then(|x| x.capture.take());
            c.map(|c| c.graph).ok_or(CUDA_ERROR_ILLEGAL_STATE)
        })?;
        out(graph, hp(g))
    }

    fn cuStreamIsCapturing(s: Handle, status: *mut u32) {
        capture_info(s, status, std::ptr::null_mut(), std::ptr::null_mut())
    }

    fn cuStreamGetCaptureInfo(s: Handle, status: *mut u32, id: *mut u64) {
        capture_info(s, status, id, std::ptr::null_mut())
    }

    fn cuStreamGetCaptureInfo_v2(
        s: Handle,
        status: *mut u32,
        id: *mut u64,
        graph: *mut Handle,
        deps: *mut *const Handle,
        num_deps: *mut usize,
    ) {
        capture_info(s, status, id, graph)?;
        if !deps.is_null() {
            *deps = std::ptr::null();
        }
        if !num_deps.is_null() {
            *num_deps = 0;
        }
        Ok(())
    }

    fn cuStreamGetCaptureInfo_v3(
        s: Handle,
        status: *mut u32,
        id: *mut u64,
        graph: *mut Handle,
        deps: *mut *const Handle,
        edges: *mut *const u8,
        num_deps: *mut usize,
    ) {
        capture_info(s, status, id, graph)?;
        if !deps.is_null() {
            *deps = std::ptr::null();
        }
        if !edges.is_null() {
            *edges = std::ptr::null();
        }
        if !num_deps.is_null() {
            *num_deps = 0;
        }
        Ok(())
    }

    fn cuEventCreate(pe: *mut Handle, flags: u32) {
        let sim = cuda()?;
        if pe.is_null() || flags & !0x7 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let e = with(|o| -> CuResult<u64> {
            let c = context::current(o, sim)?;
            Ok(stream::event_create(o, c, flags))
        })?;
        out(pe, hp(e))
    }

    fn cuEventRecord(e: Handle, s: Handle) {
        record(e, s)
    }

    fn cuEventRecordWithFlags(e: Handle, s: Handle, flags: u32) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record(e, s)
    }

    fn cuEventQuery(e: Handle) {
        cuda()?;
        let (t, ctx) = with(|o| o.events.get(&h(e)).map(|x| (crate::ipc::event_time(x), x.ctx)))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        with(|o| crate::context::check_fault(o, ctx))?;
        match t {
            Some(t) if t > now_ns() => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    fn cuEventSynchronize(e: Handle) {
        let sim = cuda()?;
        let (t, ctx) = with(|o| o.events.get(&h(e)).map(|x| (crate::ipc::event_time(x), x.ctx)))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        sleep_until(t.unwrap_or(0));
        with(|o| {
            pool::trim_all_to_threshold(o, sim);
            crate::context::check_fault(o, ctx)
        })
    }

    fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) {
        elapsed(ms, start, end)
    }

    fn cuEventElapsedTime_v2(ms: *mut f32, start: Handle, end: Handle) {
        elapsed(ms, start, end)
    }

    fn cuEventDestroy_v2(e: Handle) {
        event_destroy(e)
    }

    fn cuEventDestroy(e: Handle) {
        event_destroy(e)
    }
}

alias! {
    cuStreamWaitValue32_ptsz => cuStreamWaitValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWaitValue32_v2 => cuStreamWaitValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWaitValue32_v2_ptsz => cuStreamWaitValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWaitValue64_ptsz => cuStreamWaitValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamWaitValue64_v2 => cuStreamWaitValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamWaitValue64_v2_ptsz => cuStreamWaitValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamWriteValue32_ptsz => cuStreamWriteValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWriteValue32_v2 => cuStreamWriteValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWriteValue32_v2_ptsz => cuStreamWriteValue32(s: Handle, addr: u64, value: u32, flags: u32);
    cuStreamWriteValue64_ptsz => cuStreamWriteValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamWriteValue64_v2 => cuStreamWriteValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamWriteValue64_v2_ptsz => cuStreamWriteValue64(s: Handle, addr: u64, value: u64, flags: u32);
    cuStreamSynchronize_ptsz => cuStreamSynchronize(s: Handle);
    cuStreamQuery_ptsz => cuStreamQuery(s: Handle);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(s: Handle, e: Handle, flags: u32);
    cuStreamGetPriority_ptsz => cuStreamGetPriority(s: Handle, priority: *mut i32);
    cuStreamGetFlags_ptsz => cuStreamGetFlags(s: Handle, flags: *mut u32);
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: Handle, pctx: *mut Handle);
    cuStreamGetId_ptsz => cuStreamGetId(s: Handle, id: *mut u64);
    cuStreamGetDevice_ptsz => cuStreamGetDevice(s: Handle, dev: *mut CUdevice);
    cuStreamBeginCapture_ptsz => cuStreamBeginCapture(s: Handle);
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2(s: Handle, mode: u32);
    cuStreamEndCapture_ptsz => cuStreamEndCapture(s: Handle, graph: *mut Handle);
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing(s: Handle, status: *mut u32);
    cuStreamGetCaptureInfo_ptsz => cuStreamGetCaptureInfo(s: Handle, status: *mut u32, id: *mut u64);
    cuStreamGetCaptureInfo_v2_ptsz => cuStreamGetCaptureInfo_v2(
        s: Handle, status: *mut u32, id: *mut u64, graph: *mut Handle, deps: *mut *const Handle, num_deps: *mut usize);
    cuStreamGetCaptureInfo_v3_ptsz => cuStreamGetCaptureInfo_v3(
        s: Handle, status: *mut u32, id: *mut u64, graph: *mut Handle, deps: *mut *const Handle,
        edges: *mut *const u8, num_deps: *mut usize);
    cuEventRecord_ptsz => cuEventRecord(e: Handle, s: Handle);
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags(e: Handle, s: Handle, flags: u32);
}
