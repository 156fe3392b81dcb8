//! Contexts: primary contexts (retain / release / reset, refcounted per device), created contexts, and each
//! thread's current-context stack.
//!
//! A context costs CUDASIM_CTX_OVERHEAD bytes of device memory while it is active (a primary context from
//! its first retain to its last release or reset), as real drivers charge each context. Tearing a context
//! down frees everything it owns: memory, streams, events, modules, arrays.

use std::cell::{Cell, RefCell};

use parking_lot::Mutex;

use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

/// One context.
pub(crate) struct Context {
    /// CUDA ordinal and physical device.
    pub ordinal: usize,
    pub phys: usize,
    pub flags: u32,
    pub primary: bool,
    /// Whether the overhead is charged and the context usable (a reset primary context is inactive).
    pub active: bool,
    /// The context's default (NULL / legacy) stream.
    pub null_stream: u64,
    /// Stack size, printf FIFO and malloc heap (`CU_LIMIT_*` 0–2) as set with cuCtxSetLimit.
    pub limits: [usize; 5],
    /// Device memory those limits reserve beyond their defaults (which the context overhead covers).
    pub limit_bytes: u64,
    /// A sticky error (`CUDA_ERROR_ILLEGAL_ADDRESS` from a kernel or copy that touched memory it may not): every
    /// later call that uses the context returns it (cuda.h: "any further CUDA work will return the same
    /// error"); 0 = none. A primary context's reset clears it.
    pub fault: CUresult,
}

/// Defaults of `CU_LIMIT_STACK_SIZE`, `CU_LIMIT_PRINTF_FIFO_SIZE`, `CU_LIMIT_MALLOC_HEAP_SIZE`.
/// Stack size, printf FIFO, malloc heap, device-runtime sync depth, pending launch count.
pub(crate) const DEFAULT_LIMITS: [usize; 5] = [1024, 1 << 20, 8 << 20, 2, 2048];
/// Device memory one pending device-runtime launch reserves (the simulator's figure).
const PENDING_LAUNCH_BYTES: u64 = 2048;

/// A device's primary context.
pub(crate) struct Primary {
    pub handle: u64,
    pub refcount: u32,
    pub flags: u32,
}

const STACK_DEPTH: usize = 64;

thread_local! {
    // Const-initialised with no destructor: safe at thread and process exit in a preloaded library.
    static STACK: RefCell<[u64; STACK_DEPTH]> = const { RefCell::new([0; STACK_DEPTH]) };
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current context handle (0 = none).
pub(crate) fn current_handle() -> u64 {
    let d = DEPTH.with(|d| d.get());
    if d == 0 {
        0
    } else {
        STACK.with(|s| s.borrow()[d - 1])
    }
}

/// Replaces the top of the thread's stack (cuCtxSetCurrent); 0 unbinds.
pub(crate) fn set_current(h: u64) {
    let d = DEPTH.with(|d| d.get());
    if h == 0 {
        if d > 0 {
            DEPTH.with(|x| x.set(d - 1));
        }
    } else if d == 0 {
        push(h);
    } else {
        STACK.with(|s| s.borrow_mut()[d - 1] = h);
    }
}

/// cuCtxPushCurrent. The stack holds 64 contexts; deeper pushes replace the top.
pub(crate) fn push(h: u64) {
    let d = DEPTH.with(|d| d.get());
    if d < STACK_DEPTH {
        STACK.with(|s| s.borrow_mut()[d] = h);
        DEPTH.with(|x| x.set(d + 1));
    } else {
        STACK.with(|s| s.borrow_mut()[d - 1] = h);
    }
}

/// cuCtxPopCurrent: the popped handle (0 if the stack was empty).
pub(crate) fn pop() -> u64 {
    let h = current_handle();
    let d = DEPTH.with(|d| d.get());
    if d > 0 {
        DEPTH.with(|x| x.set(d - 1));
    }
    h
}

/// Removes `h` from the calling thread's stack (the context was destroyed).
fn forget_in_this_thread(h: u64) {
    let d = DEPTH.with(|d| d.get());
    if d > 0 && current_handle() == h {
        DEPTH.with(|x| x.set(d - 1));
    }
}

/// Makes sure the primary-context table covers every visible device.
pub(crate) fn ensure_primaries(o: &mut Objects, sim: &Sim) {
    while o.primaries.len() < sim.visible.len() {
        let ordinal = o.primaries.len();
        let handle = new_handle(Kind::Context);
        o.contexts.insert(
            handle,
            Context {
                ordinal,
                phys: sim.visible[ordinal],
                flags: 0,
                primary: true,
                active: false,
                null_stream: 0,
                limits: DEFAULT_LIMITS,
                limit_bytes: 0,
                fault: 0,
            },
        );
        o.primaries.push(Primary {
            handle,
            refcount: 0,
            flags: 0,
        });
    }
}

/// Charges the overhead and creates the default stream.
fn activate(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    let Some(c) = o.contexts.get(&h) else {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    };
    if c.active {
        return Ok(());
    }
    let phys = c.phys;
    sim.charge(phys, sim.cfg.ctx_overhead)?;
    sim.count_context(phys, 1);
    let s = crate::stream::create(o, h, 0, 0);
    if let Some(c) = o.contexts.get_mut(&h) {
        c.active = true;
        c.null_stream = s;
    }
    Ok(())
}

/// Frees everything the context owns and its overhead; it stays in the table (inactive) for primaries.
fn deactivate(o: &mut Objects, sim: &Sim, h: u64) {
    let Some(c) = o.contexts.get(&h) else { return };
    if !c.active {
        return;
    }
    let (phys, limit_bytes) = (c.phys, c.limit_bytes);
    crate::graph::destroy_for_context(o, sim, h);
    crate::stream::destroy_for_context(o, h);
    crate::module::destroy_for_context(o, sim, h);
    crate::array::destroy_for_context(o, sim, h);
    crate::memory::free_for_context(o, sim, h);
    sim.uncharge(phys, sim.cfg.ctx_overhead + limit_bytes);
    sim.count_context(phys, -1);
    if let Some(c) = o.contexts.get_mut(&h) {
        c.active = false;
        c.null_stream = 0;
        c.limits = DEFAULT_LIMITS;
        c.limit_bytes = 0;
        c.fault = 0;
    }
    crate::touch::forget_context(o, h);
}

/// The context's sticky error, if any (an unknown context has none).
pub(crate) fn check_fault(o: &Objects, h: u64) -> CuResult<()> {
    match o.contexts.get(&h).map_or(0, |c| c.fault) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Device memory the memory-backed limits reserve beyond their defaults: the stack for every thread the device
/// can hold (SMs × 2048, `MAX_THREADS_PER_MULTIPROCESSOR`), the printf FIFO, the malloc heap and the buffer of
/// pending device-runtime launches (the sync depth reserves nothing here).
fn limit_bytes(limits: &[usize; 5], sms: u64) -> u64 {
    let bytes = |l: &[usize; 5]| {
        [
            l[0] as u64 * sms * 2048,
            l[1] as u64,
            l[2] as u64,
            (l[4] as u64).saturating_mul(PENDING_LAUNCH_BYTES),
        ]
    };
    let (now, base) = (bytes(limits), bytes(&DEFAULT_LIMITS));
    now.iter().zip(base).map(|(n, b)| n.saturating_sub(b)).sum()
}

/// cuCtxSetLimit of a memory-backed limit (0–4) on the current context: the reservation grows or shrinks with
/// it, and a reservation the device cannot hold fails with CUDA_ERROR_OUT_OF_MEMORY (the limit unchanged).
pub(crate) fn set_memory_limit(o: &mut Objects, sim: &Sim, limit: usize, value: usize) -> CuResult<()> {
    let h = current(o, sim)?;
    set_limit_of(o, sim, h, limit, value)
}

fn set_limit_of(o: &mut Objects, sim: &Sim, h: u64, limit: usize, value: usize) -> CuResult<()> {
    let c = o.contexts.get_mut(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let mut limits = c.limits;
    limits[limit] = value;
    let bytes = limit_bytes(&limits, sim.cfg.devices[c.phys].sms as u64);
    if bytes > c.limit_bytes {
        sim.charge(c.phys, bytes - c.limit_bytes)?;
    } else {
        sim.uncharge(c.phys, c.limit_bytes - bytes);
    }
    c.limits = limits;
    c.limit_bytes = bytes;
    Ok(())
}

/// A launch in context `h` of a kernel with `local` bytes of local memory per thread: a smaller stack grows to
/// it (for every thread the device holds, and stays), as a real driver grows it implicitly at such a launch;
/// CUDA_ERROR_OUT_OF_MEMORY when the device cannot hold it.
pub(crate) fn grow_stack(o: &mut Objects, sim: &Sim, h: u64, local: u64) -> CuResult<()> {
    let c = o.contexts.get(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if local <= c.limits[0] as u64 {
        return Ok(());
    }
    set_limit_of(o, sim, h, 0, local as usize)
}

/// The current context's value of memory-backed limit `limit` (0–4).
pub(crate) fn memory_limit(o: &mut Objects, sim: &Sim, limit: usize) -> CuResult<usize> {
    let h = current(o, sim)?;
    Ok(o.contexts.get(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.limits[limit])
}

/// A usable context: `h`, or the current one when `h` is 0. A primary context that was reset while still
/// retained comes back to life on use (as on a real driver).
pub(crate) fn resolve(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<u64> {
    let implicit = h == 0;
    let h = if implicit { current_handle() } else { h };
    if h == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let Some(c) = o.contexts.get(&h) else {
        // cuCtxDestroy leaves the context current to other threads, whose calls then fail this way.
        return Err(if implicit && o.destroyed.contains(&h) {
            CUDA_ERROR_CONTEXT_IS_DESTROYED
        } else {
            CUDA_ERROR_INVALID_CONTEXT
        });
    };
    if c.fault != 0 {
        return Err(c.fault);
    }
    if !c.active {
        let retained = c.primary && o.primaries.get(c.ordinal).is_some_and(|p| p.refcount > 0);
        if !retained {
            // A thread whose current context is a released (uninitialised) primary context.
            return Err(if implicit {
                CUDA_ERROR_CONTEXT_IS_DESTROYED
            } else {
                CUDA_ERROR_INVALID_CONTEXT
            });
        }
        activate(o, sim, h)?;
    }
    Ok(h)
}

/// The current context (CUDA_ERROR_INVALID_CONTEXT if none).
pub(crate) fn current(o: &mut Objects, sim: &Sim) -> CuResult<u64> {
    resolve(o, sim, 0)
}

/// cuDevicePrimaryCtxRetain.
pub(crate) fn primary_retain(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    ensure_primaries(o, sim);
    let h = o.primaries.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?.handle;
    let flags = o.primaries[ordinal].flags;
    if let Some(c) = o.contexts.get_mut(&h) {
        c.flags = flags;
    }
    activate(o, sim, h)?;
    o.primaries[ordinal].refcount += 1;
    Ok(h)
}

/// cuDevicePrimaryCtxRelease: the last release destroys the context's resources. Returns the handle when
/// it was torn down (for destroy hooks).
pub(crate) fn primary_release(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<Option<u64>> {
    ensure_primaries(o, sim);
    let p = o.primaries.get_mut(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    if p.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refcount -= 1;
    let h = p.handle;
    if p.refcount == 0 {
        deactivate(o, sim, h);
        return Ok(Some(h));
    }
    Ok(None)
}

/// cuDevicePrimaryCtxReset: destroys the resources, keeps the refcount.
pub(crate) fn primary_reset(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    ensure_primaries(o, sim);
    let h = o.primaries.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?.handle;
    deactivate(o, sim, h);
    if let Some(p) = o.primaries.get_mut(ordinal) {
        p.flags = 0;
    }
    Ok(h)
}

/// The primary context handle of a CUDA ordinal, without retaining it.
pub(crate) fn primary_handle(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    ensure_primaries(o, sim);
    Ok(o.primaries.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?.handle)
}

/// cuCtxCreate: a new active context, pushed on the calling thread's stack.
pub(crate) fn create(o: &mut Objects, sim: &Sim, ordinal: usize, flags: u32) -> CuResult<u64> {
    ensure_primaries(o, sim);
    let phys = *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let h = new_handle(Kind::Context);
    o.contexts.insert(
        h,
        Context {
            ordinal,
            phys,
            flags,
            primary: false,
            active: false,
            null_stream: 0,
            limits: DEFAULT_LIMITS,
            limit_bytes: 0,
            fault: 0,
        },
    );
    if let Err(e) = activate(o, sim, h) {
        o.contexts.remove(&h);
        return Err(e);
    }
    push(h);
    Ok(h)
}

/// cuCtxDestroy (not for primary contexts).
pub(crate) fn destroy(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    match o.contexts.get(&h) {
        None => return Err(CUDA_ERROR_INVALID_CONTEXT),
        Some(c) if c.primary => return Err(CUDA_ERROR_INVALID_CONTEXT),
        Some(_) => {}
    }
    deactivate(o, sim, h);
    o.contexts.remove(&h);
    o.destroyed.insert(h);
    forget_in_this_thread(h);
    Ok(())
}

/// Functions the runtime helper (export tables) registers to run when a context is torn down
/// (context-local storage destructors).
static DESTROY_HOOKS: Mutex<Vec<fn(u64)>> = Mutex::new(Vec::new());

/// Registers `f(ctx_handle)` to run after a context is destroyed or a primary context reset / released.
#[allow(dead_code)]
pub(crate) fn register_destroy_hook(f: fn(u64)) {
    DESTROY_HOOKS.lock().push(f);
}

/// Runs the destroy hooks for `h` (call without the object lock held).
pub(crate) fn run_destroy_hooks(h: u64) {
    let hooks: Vec<fn(u64)> = DESTROY_HOOKS.lock().clone();
    for f in hooks {
        f(h);
    }
}

/// (ordinal, physical device) of a context.
pub(crate) fn device_of(o: &Objects, h: u64) -> CuResult<(usize, usize)> {
    o.contexts
        .get(&h)
        .map(|c| (c.ordinal, c.phys))
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}
