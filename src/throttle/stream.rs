//! Which device a launch runs on: the device of its stream's context, not of the calling thread's current
//! context (a context-less `CUkernel`, a graph, or any launch onto another context's stream runs where the stream
//! is). `cuStreamGetDevice` answers where the driver has it (CUDA 12.8+); older drivers get `cuStreamGetCtx` and a
//! small cache of context → device, filled on a miss by making the context current for one `cuCtxGetDevice`
//! (push/pop, the slow path) and emptied when a context is destroyed (a new context may reuse the address). The
//! NULL, legacy and per-thread streams are the current context's.

use crate::driver::cuda::{in_context, CudaTable};
use crate::ffi::cuda::{CUcontext, CUdevice, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Cache entries (direct-mapped by context address).
const SLOTS: usize = 16;

/// One cache entry: a seqlock (odd `seq` = being written) over the context and `generation << 32 | ordinal`.
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    ctx: AtomicUsize,
    dev: AtomicU64,
}

/// Context → device, lock-free: lookups read one slot; a writer that finds the slot busy skips the insert.
#[derive(Default)]
pub(crate) struct StreamDevices {
    slots: [Slot; SLOTS],
    /// Bumped when a context goes away: entries of an older generation are ignored.
    generation: AtomicU32,
}

fn slot_of(ctx: usize) -> usize {
    (ctx >> 4 ^ ctx >> 12) % SLOTS
}

impl StreamDevices {
    /// The CUDA ordinal `stream`'s work runs on; `None` when the driver cannot say (the launch is then charged
    /// as the strictest device: see `SmThrottle::launch`).
    pub(crate) fn device_of(&self, cuda: &CudaTable, stream: usize) -> Option<CUdevice> {
        let mut d: CUdevice = -1;
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            // SAFETY: valid out-pointer.
            return unsafe { cuda.cuCtxGetDevice(&mut d) }.ok().then_some(d);
        }
        if cuda.cuStreamGetDevice.is_some() {
            // SAFETY: the program's stream handle, a valid out-pointer.
            return unsafe { cuda.cuStreamGetDevice(stream as CUstream, &mut d) }
                .ok()
                .then_some(d);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the program's stream handle, a valid out-pointer.
        if !unsafe { cuda.cuStreamGetCtx(stream as CUstream, &mut ctx) }.ok() || ctx.is_null() {
            return None;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(d) = self.lookup(ctx as usize, generation) {
            return Some(d);
        }
        let d = ctx_device(cuda, ctx)?;
        self.insert(ctx as usize, d, generation);
        Some(d)
    }

    /// Forgets every context (called after a context is destroyed or a primary context released).
    pub(crate) fn contexts_changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn lookup(&self, ctx: usize, generation: u32) -> Option<CUdevice> {
        let s = &self.slots[slot_of(ctx)];
        let seq = s.seq.load(Ordering::Acquire);
        if seq & 1 != 0 {
            return None;
        }
        let c = s.ctx.load(Ordering::Relaxed);
        let v = s.dev.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let stable = s.seq.load(Ordering::Relaxed) == seq;
        (stable && c == ctx && (v >> 32) as u32 == generation).then_some(v as u32 as CUdevice)
    }

    fn insert(&self, ctx: usize, dev: CUdevice, generation: u32) {
        let s = &self.slots[slot_of(ctx)];
        let seq = s.seq.load(Ordering::Relaxed);
        if seq & 1 != 0
            || s.seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        s.ctx.store(ctx, Ordering::Relaxed);
        s.dev.store(
            u64::from(generation) << 32 | u64::from(dev as u32),
            Ordering::Relaxed,
        );
        s.seq.store(seq + 2, Ordering::Release);
        // A context destroyed while we resolved it: the entry's generation is already stale, so it is never used.
    }
}

/// The device of context `ctx`: `cuCtxGetDevice` with `ctx` current (pushed for the call when it is not).
fn ctx_device(cuda: &CudaTable, ctx: CUcontext) -> Option<CUdevice> {
    let mut d: CUdevice = -1;
    // SAFETY: valid out-pointer.
    in_context(cuda, ctx, || unsafe { cuda.cuCtxGetDevice(&mut d) }.ok())
        .unwrap_or(false)
        .then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::cuda::CUresult;
    use std::cell::Cell;

    // A fake driver: stream handles 0x1000 + 0x100·d live in context 0x10_000 + 0x100·d, on device d; the
    // current context is per thread (like the driver's).
    thread_local! {
        static CURRENT: Cell<usize> = const { Cell::new(0x10_000) };
        static PUSHES: Cell<u32> = const { Cell::new(0) };
    }

    unsafe extern "C" fn get_device(s: CUstream, d: *mut CUdevice) -> CUresult {
        // SAFETY: test out-pointer.
        unsafe { *d = ((s as usize - 0x1000) / 0x100) as CUdevice };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn get_ctx(s: CUstream, c: *mut CUcontext) -> CUresult {
        // SAFETY: test out-pointer.
        unsafe { *c = (0x10_000 + (s as usize - 0x1000)) as CUcontext };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn ctx_device(d: *mut CUdevice) -> CUresult {
        // SAFETY: test out-pointer.
        unsafe { *d = ((CURRENT.get() - 0x10_000) / 0x100) as CUdevice };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn current(c: *mut CUcontext) -> CUresult {
        // SAFETY: test out-pointer.
        unsafe { *c = CURRENT.get() as CUcontext };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn push(c: CUcontext) -> CUresult {
        PUSHES.set(PUSHES.get() + 1);
        CURRENT.set(c as usize);
        CUresult::SUCCESS
    }
    unsafe extern "C" fn pop(c: *mut CUcontext) -> CUresult {
        // SAFETY: test out-pointer.
        unsafe { *c = CURRENT.get() as CUcontext };
        CURRENT.set(0x10_000);
        CUresult::SUCCESS
    }

    fn table(stream_get_device: bool) -> CudaTable {
        let mut t = CudaTable::empty(true);
        if stream_get_device {
            t.cuStreamGetDevice = Some(get_device);
        }
        t.cuStreamGetCtx = Some(get_ctx);
        t.cuCtxGetDevice = Some(ctx_device);
        t.cuCtxGetCurrent = Some(current);
        t.cuCtxPushCurrent_v2 = Some(push);
        t.cuCtxPopCurrent_v2 = Some(pop);
        t
    }

    #[test]
    fn the_streams_device_not_the_current_contexts() {
        let sd = StreamDevices::default();
        for t in [table(true), table(false)] {
            assert_eq!(sd.device_of(&t, 0x1100), Some(1));
            assert_eq!(sd.device_of(&t, 0x1300), Some(3));
            assert_eq!(sd.device_of(&t, 0x1000), Some(0));
            // The NULL, legacy and per-thread streams are the current context's.
            for s in [0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD] {
                assert_eq!(sd.device_of(&t, s), Some(0));
            }
            assert_eq!(CURRENT.get(), 0x10_000, "the current context is restored");
        }
    }

    #[test]
    fn without_cu_stream_get_device_a_context_is_pushed_once_until_contexts_change() {
        let sd = StreamDevices::default();
        let t = table(false);
        PUSHES.set(0);
        for _ in 0..100 {
            assert_eq!(sd.device_of(&t, 0x1200), Some(2));
        }
        assert_eq!(PUSHES.get(), 1, "cached after the first launch");
        sd.contexts_changed();
        assert_eq!(sd.device_of(&t, 0x1200), Some(2));
        assert_eq!(PUSHES.get(), 2, "a destroyed context's entry is not reused");
        // With cuStreamGetDevice nothing is pushed at all.
        assert_eq!(sd.device_of(&table(true), 0x1500), Some(5));
        assert_eq!(PUSHES.get(), 2);
    }

    #[test]
    fn a_driver_that_cannot_tell_gives_none() {
        let sd = StreamDevices::default();
        assert_eq!(sd.device_of(&CudaTable::empty(true), 0x1100), None);
        assert_eq!(sd.device_of(&CudaTable::empty(true), 0), None);
    }
}
