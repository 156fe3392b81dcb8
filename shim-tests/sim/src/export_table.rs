//! The driver's private interfaces ("export tables") that the CUDA runtime asks for with `cuGetExportTable`.
//!
//! Why this exists: a program built by nvcc links the CUDA runtime statically (`-cudart static` is nvcc's
//! default). Besides the public driver API, that runtime fetches undocumented tables of function pointers from
//! the driver, each named by a 16-byte UUID, and refuses to work (error 103, "software validity not
//! established", or an abort before `main`) when they are missing or answer wrongly. To run real CUDA programs
//! on the simulator we serve the tables the runtime needs, with the behaviour public reimplementations of the
//! driver have documented (ZLUDA's dark API notes; see `docs/examples.md` for what is known and unknown).
//! Nothing here is NVIDIA code: every function is ours and does the least the runtime observably needs.
//!
//! Layout: a table is an array of pointer-sized words. Most start with their own size in bytes (word 0); the
//! context-local-storage table does not. Every slot we do not understand points at a function of its own
//! (`unknown::<TABLE, SLOT>`) that logs (with `CUDASIM_TRACE_EXPORTS=1`) and returns
//! `CUDA_ERROR_NOT_SUPPORTED`, so a runtime that calls it gets an error instead of a jump to address 0.
//!
//! | UUID | name | what we serve |
//! | --- | --- | --- |
//! | `f8cff951-2146-8b4e-b9e2-fb469e7c0dd9` | (asked before cuInit) | `CUDA_ERROR_NOT_FOUND`, as a driver without it |
//! | `6bd5fb6c-5bf4-e74a-8987-d93912fd9df9` | CUDART_INTERFACE | 13 slots (driver ≥ 13.0) or 10; slot 2 = primary context |
//! | `a094798c-2e74-2e74-93f2-0800200c0a66` | runtime callback hooks | 7 slots; slots 2, 6 hand out buffers; rest no-ops |
//! | `42d85a81-23f6-cb47-8298-f6e78a3aecdc` | tools TLS | size word only (4 slots) |
//! | `c693336e-1121-df11-a8c3-68f355d89593` | context-local storage | put / delete / get; destructors on context destruction |
//! | `263e8860-7cd2-6143-92f6-bbd5006dfa7e` | context checks | slot 2 writes 0, slot 3 returns 0 |
//! | `d4082055-bde6-704b-8d34-ba123c66e1f2` | integrity check | slot 1: HMAC-MD2 over what runtime and driver both know |
//! | `21318c60-9714-3248-8ca6-41ff7324c8f2` | (purpose unknown) | size word + 4 unknown slots: a 13.4 runtime (cuDNN 9.26's) fails to start without it |
//!
//! Contract with the rest of the simulator: `cuGetExportTable` calls [`get`] (or [`lookup`]); the first lookup
//! registers [`context_destroyed`] with `context::register_destroy_hook`, which the simulator runs (without its
//! locks held: the runtime's destructors call back into the driver) whenever a context is torn down.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

#[path = "runtime/md2.rs"]
mod md2;

type CUresult = c_uint;
type CUcontext = *mut c_void;
type CUdevice = c_int;
type CUmodule = *mut c_void;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// What the tables need from the simulator.
///
/// The primary context and the current context come from the simulator's internals, not its exported C API:
/// a real driver serves the runtime's slot 2 internally, so a preloaded interposer (cuquota) must not see a
/// `cuDevicePrimaryCtxRetain` here that it would not see on a GPU. The integrity hash's inputs are read through
/// the exported API, the same way the runtime reads them.
mod sim {
    use super::{CUcontext, CUdevice, CUmodule, CUresult};
    use std::ffi::{c_int, c_void};

    pub(crate) const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
    pub(crate) const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
    pub(crate) const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;

    extern "C" {
        pub(crate) fn cuDriverGetVersion(version: *mut c_int) -> CUresult;
        pub(crate) fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
        pub(crate) fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult;
        pub(crate) fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult;
        pub(crate) fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult;
    }

    /// Retains and returns device `dev`'s primary context (as cuDevicePrimaryCtxRetain, internally).
    pub(crate) fn primary_context(dev: CUdevice) -> Result<CUcontext, CUresult> {
        let sim = crate::sim::cuda()?;
        sim.phys(dev)?;
        let ordinal = usize::try_from(dev).map_err(|_| super::CUDA_ERROR_INVALID_VALUE)?;
        let h = crate::objects::with(|o| crate::context::primary_retain(o, sim, ordinal))?;
        Ok(h as usize as CUcontext)
    }

    /// The calling thread's current context (NULL if none).
    pub(crate) fn current_context() -> CUcontext {
        crate::context::current_handle() as usize as CUcontext
    }
}

// ---------------------------------------------------------------------------------------------------------
// Table plumbing
// ---------------------------------------------------------------------------------------------------------

/// One export table: what `cuGetExportTable` hands out is the address of `.0[0]`.
#[repr(transparent)]
struct Table<const N: usize>([*const c_void; N]);

// SAFETY: a table is never written after construction; it holds code addresses and integers only.
unsafe impl<const N: usize> Sync for Table<N> {}

/// Word 0 of most tables: the table's size in bytes.
const fn size_word(slots: usize) -> *const c_void {
    (slots * std::mem::size_of::<usize>()) as *const c_void
}

/// Table identifiers used by [`unknown`] for its message.
const T_CUDART: usize = 0;
const T_HOOKS: usize = 1;
const T_TLS: usize = 2;
const T_CLS: usize = 3;
const T_CHECKS: usize = 4;
const T_INTEGRITY: usize = 5;
const T_RUNTIME_13_4: usize = 6;
const TABLE_NAMES: [&str; 7] = [
    "CUDART_INTERFACE",
    "RUNTIME_CALLBACK_HOOKS",
    "TOOLS_TLS",
    "CONTEXT_LOCAL_STORAGE",
    "CONTEXT_CHECKS",
    "INTEGRITY_CHECK",
    "RUNTIME_13_4 (21318c60)",
];

/// A slot whose meaning nobody has documented: fail cleanly instead of crashing.
extern "C" fn unknown<const TABLE: usize, const SLOT: usize>() -> CUresult {
    trace(format_args!(
        "{}[{}] called: unknown slot, CUDA_ERROR_NOT_SUPPORTED",
        TABLE_NAMES[TABLE], SLOT
    ));
    CUDA_ERROR_NOT_SUPPORTED
}

/// A slot the runtime calls for notification only (tools hooks): accept and do nothing.
extern "C" fn no_op<const TABLE: usize, const SLOT: usize>() -> CUresult {
    trace(format_args!("{}[{}] called: no-op", TABLE_NAMES[TABLE], SLOT));
    CUDA_SUCCESS
}

const fn unk<const TABLE: usize, const SLOT: usize>() -> *const c_void {
    unknown::<TABLE, SLOT> as *const c_void
}

const fn nop<const TABLE: usize, const SLOT: usize>() -> *const c_void {
    no_op::<TABLE, SLOT> as *const c_void
}

/// 0 = not read yet, 1 = off, 2 = on.
static TRACE: AtomicU8 = AtomicU8::new(0);

fn trace(args: std::fmt::Arguments<'_>) {
    let mut state = TRACE.load(Ordering::Relaxed);
    if state == 0 {
        let on = std::env::var_os("CUDASIM_TRACE_EXPORTS").is_some_and(|v| !v.is_empty() && v != "0");
        state = if on { 2 } else { 1 };
        TRACE.store(state, Ordering::Relaxed);
    }
    if state == 2 {
        eprintln!("cudasim export: {args}");
    }
}

/// Runs a table function, turning a panic into `CUDA_ERROR_UNKNOWN` (a panic must not unwind into C).
fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

// ---------------------------------------------------------------------------------------------------------
// Lookup
// ---------------------------------------------------------------------------------------------------------

const UUID_BEFORE_INIT: [u8; 16] = uuid(
    0xf8cff951,
    0x2146,
    0x8b4e,
    [0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9],
);
const UUID_CUDART_INTERFACE: [u8; 16] = uuid(
    0x6bd5fb6c,
    0x5bf4,
    0xe74a,
    [0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9],
);
const UUID_CALLBACK_HOOKS: [u8; 16] = uuid(
    0xa094798c,
    0x2e74,
    0x2e74,
    [0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66],
);
const UUID_TOOLS_TLS: [u8; 16] = uuid(
    0x42d85a81,
    0x23f6,
    0xcb47,
    [0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc],
);
const UUID_CONTEXT_LOCAL_STORAGE: [u8; 16] = uuid(
    0xc693336e,
    0x1121,
    0xdf11,
    [0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93],
);
const UUID_CONTEXT_CHECKS: [u8; 16] = uuid(
    0x263e8860,
    0x7cd2,
    0x6143,
    [0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e],
);
/// Asked for by CUDA 13.4 runtimes during their initialisation (the 13.0 and 13.2 runtimes do not ask);
/// without it the runtime fails to start (cuDNN: CUDNN_STATUS_NOT_INITIALIZED). cuBLAS 13.4 calls its slot 4
/// with tables of its own, on a path that first needs TOOLS_TLS slot 2 (see the simulator's README).
const UUID_RUNTIME_13_4: [u8; 16] = uuid(
    0x21318c60,
    0x9714,
    0x3248,
    [0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2],
);
const UUID_INTEGRITY_CHECK: [u8; 16] = uuid(
    0xd4082055,
    0xbde6,
    0x704b,
    [0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2],
);

/// The byte order the runtime uses: the UUID's text read left to right.
const fn uuid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_be_bytes();
    let b = b.to_be_bytes();
    let c = c.to_be_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
    ]
}

/// What `cuGetExportTable` should answer for `id`: the table's address, or the error to return (with a NULL
/// table pointer).
pub(crate) fn lookup(id: &[u8; 16]) -> Result<*const c_void, CUresult> {
    // The runtime asks for its tables before it creates any context: from then on, context teardown runs the
    // context-local-storage destructors.
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        crate::context::register_destroy_hook(|h| context_destroyed(h as usize as *mut c_void))
    });
    let found: Option<*const c_void> = match *id {
        UUID_CUDART_INTERFACE => Some(cudart_interface()),
        UUID_CALLBACK_HOOKS => Some(CALLBACK_HOOKS.0.as_ptr().cast()),
        UUID_TOOLS_TLS => Some(TOOLS_TLS.0.as_ptr().cast()),
        UUID_CONTEXT_LOCAL_STORAGE => Some(CONTEXT_LOCAL_STORAGE.0.as_ptr().cast()),
        UUID_CONTEXT_CHECKS => Some(CONTEXT_CHECKS.0.as_ptr().cast()),
        UUID_INTEGRITY_CHECK => Some(INTEGRITY_CHECK.0.as_ptr().cast()),
        UUID_RUNTIME_13_4 => Some(RUNTIME_13_4.0.as_ptr().cast()),
        _ => None,
    };
    trace(format_args!(
        "cuGetExportTable({}) -> {}",
        id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        if found.is_some() {
            "table"
        } else {
            "CUDA_ERROR_NOT_FOUND"
        }
    ));
    // UUID_BEFORE_INIT (and anything else) is answered as a driver that does not have it.
    let _ = UUID_BEFORE_INIT;
    found.ok_or(CUDA_ERROR_NOT_FOUND)
}

/// [`lookup`] without the error code (`None` = `CUDA_ERROR_NOT_FOUND`).
pub(crate) fn get(id: &[u8; 16]) -> Option<*const c_void> {
    lookup(id).ok()
}

// ---------------------------------------------------------------------------------------------------------
// CUDART_INTERFACE
// ---------------------------------------------------------------------------------------------------------

/// 13.x drivers hand out 13 slots, 12.x drivers 10; the runtime checks the size word against what it needs.
/// We follow the driver version the simulator advertises (`CUDASIM_DRIVER_VERSION`).
fn cudart_interface() -> *const c_void {
    if driver_version() >= 13000 {
        CUDART_INTERFACE_13.0.as_ptr().cast()
    } else {
        CUDART_INTERFACE_12.0.as_ptr().cast()
    }
}

static CUDART_INTERFACE_13: Table<13> = Table([
    size_word(13),
    cudart_load_module as *const c_void,
    cudart_primary_context as *const c_void,
    unk::<T_CUDART, 3>(),
    unk::<T_CUDART, 4>(),
    unk::<T_CUDART, 5>(),
    cudart_load_module_ext as *const c_void,
    cudart_success_1 as *const c_void,
    cudart_load_module_from_header as *const c_void,
    unk::<T_CUDART, 9>(),
    unk::<T_CUDART, 10>(),
    unk::<T_CUDART, 11>(),
    cudart_success_1 as *const c_void,
]);

static CUDART_INTERFACE_12: Table<10> = Table([
    size_word(10),
    cudart_load_module as *const c_void,
    cudart_primary_context as *const c_void,
    unk::<T_CUDART, 3>(),
    unk::<T_CUDART, 4>(),
    unk::<T_CUDART, 5>(),
    cudart_load_module_ext as *const c_void,
    cudart_success_1 as *const c_void,
    cudart_load_module_from_header as *const c_void,
    unk::<T_CUDART, 9>(),
]);

/// The wrapper nvcc puts around each embedded fat binary (`__fatbinwrap`).
#[repr(C)]
struct FatbinWrapper {
    magic: u32,
    version: u32,
    data: *const c_void,
    filename_or_fatbins: *const c_void,
}

const FATBIN_WRAPPER_MAGIC: u32 = 0x466243B1;

/// The image inside a fat-binary wrapper (or the pointer itself when it is not one).
///
/// # Safety
/// `wrapper` is NULL or points at readable memory of at least a wrapper's size.
unsafe fn unwrap_fatbin(wrapper: *const c_void) -> *const c_void {
    let w = wrapper.cast::<FatbinWrapper>();
    if w.is_null() {
        return wrapper;
    }
    // SAFETY: the caller passes a fat-binary wrapper (or an image at least as long as one).
    let w = unsafe { &*w };
    if w.magic == FATBIN_WRAPPER_MAGIC {
        w.data
    } else {
        wrapper
    }
}

fn load(module: *mut CUmodule, image: *const c_void) -> CUresult {
    if module.is_null() || image.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: both pointers were checked non-NULL and come from the runtime, which owns them.
    unsafe { sim::cuModuleLoadData(module, image) }
}

/// Slot 1: load the module of a fat-binary wrapper (runtimes before cuLibrary* use it to register kernels).
unsafe extern "C" fn cudart_load_module(module: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    guard(|| {
        trace(format_args!("CUDART_INTERFACE[1](module, wrapper={wrapper:p})"));
        // SAFETY: the runtime passes its fat-binary wrapper.
        load(module, unsafe { unwrap_fatbin(wrapper) })
    })
}

/// Slot 6: as slot 1 with three extra arguments we have not seen used.
unsafe extern "C" fn cudart_load_module_ext(
    module: *mut CUmodule,
    wrapper: *const c_void,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: c_uint,
) -> CUresult {
    guard(|| {
        trace(format_args!("CUDART_INTERFACE[6](module, wrapper={wrapper:p})"));
        // SAFETY: the runtime passes its fat-binary wrapper.
        load(module, unsafe { unwrap_fatbin(wrapper) })
    })
}

/// Slot 8: load a module from a fat-binary header (not wrapped).
unsafe extern "C" fn cudart_load_module_from_header(
    header: *const c_void,
    module: *mut CUmodule,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: c_uint,
) -> CUresult {
    guard(|| {
        trace(format_args!("CUDART_INTERFACE[8](header={header:p}, module)"));
        load(module, header)
    })
}

/// Slot 2: the device's primary context (retained, as the runtime's own bookkeeping expects it to live).
unsafe extern "C" fn cudart_primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let r = sim::primary_context(dev);
        trace(format_args!("CUDART_INTERFACE[2](dev={dev}) -> {r:?}"));
        match r {
            Ok(ctx) => {
                // SAFETY: pctx was checked non-NULL; the runtime passes a CUcontext slot.
                unsafe { *pctx = ctx };
                CUDA_SUCCESS
            }
            Err(e) => e,
        }
    })
}

/// Slots 7 and 12: calls whose arguments are not understood and that must succeed.
extern "C" fn cudart_success_1(arg: usize) -> CUresult {
    trace(format_args!("CUDART_INTERFACE[7|12](0x{arg:x}) -> success"));
    CUDA_SUCCESS
}

// ---------------------------------------------------------------------------------------------------------
// Runtime callback hooks and tools TLS
// ---------------------------------------------------------------------------------------------------------

/// A writable static buffer handed to the runtime (tools hooks record state in it; we never read it).
#[repr(C, align(16))]
struct HookBuffer<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the simulator never reads or writes the buffer; only the runtime that received its address does.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static HOOK_BUFFER_A: HookBuffer<4096> = HookBuffer(UnsafeCell::new([0; 4096]));
static HOOK_BUFFER_B: HookBuffer<56> = HookBuffer(UnsafeCell::new([0; 56]));

/// # Safety
/// `ptr` and `size` are NULL or writable.
unsafe fn hand_out<const N: usize>(buffer: &'static HookBuffer<N>, ptr: *mut *mut c_void, size: *mut usize) {
    if !ptr.is_null() {
        // SAFETY: checked non-NULL; the runtime passes a pointer slot.
        unsafe { *ptr = buffer.0.get().cast() };
    }
    if !size.is_null() {
        // SAFETY: checked non-NULL; the runtime passes a size slot.
        unsafe { *size = N };
    }
}

unsafe extern "C" fn hooks_buffer_a(ptr: *mut *mut c_void, size: *mut usize) {
    trace(format_args!("RUNTIME_CALLBACK_HOOKS[2] -> buffer of 4096 bytes"));
    // SAFETY: the runtime passes writable out-pointers (or NULL, which hand_out skips).
    unsafe { hand_out(&HOOK_BUFFER_A, ptr, size) }
}

unsafe extern "C" fn hooks_buffer_b(ptr: *mut *mut c_void, size: *mut usize) {
    trace(format_args!("RUNTIME_CALLBACK_HOOKS[6] -> buffer of 56 bytes"));
    // SAFETY: as in hooks_buffer_a.
    unsafe { hand_out(&HOOK_BUFFER_B, ptr, size) }
}

static CALLBACK_HOOKS: Table<7> = Table([
    size_word(7),
    nop::<T_HOOKS, 1>(),
    hooks_buffer_a as *const c_void,
    nop::<T_HOOKS, 3>(),
    nop::<T_HOOKS, 4>(),
    nop::<T_HOOKS, 5>(),
    hooks_buffer_b as *const c_void,
]);

static TOOLS_TLS: Table<4> = Table([
    size_word(4),
    unk::<T_TLS, 1>(),
    unk::<T_TLS, 2>(),
    unk::<T_TLS, 3>(),
]);

/// Only its presence is needed to start a 13.4 runtime; no slot's meaning is known (slot 4 is the highest
/// seen called).
static RUNTIME_13_4: Table<5> = Table([
    size_word(5),
    unk::<T_RUNTIME_13_4, 1>(),
    unk::<T_RUNTIME_13_4, 2>(),
    unk::<T_RUNTIME_13_4, 3>(),
    unk::<T_RUNTIME_13_4, 4>(),
]);

// ---------------------------------------------------------------------------------------------------------
// Context-local storage
// ---------------------------------------------------------------------------------------------------------

/// Destructor the runtime registers with a value: `(context, key, value)`.
type ClsDestructor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

struct ClsEntry {
    ctx: usize,
    key: usize,
    value: usize,
    dtor: ClsDestructor,
}

/// Few entries (the runtime keeps one or two per context): a vector is the simplest map.
static CLS: Mutex<Vec<ClsEntry>> = Mutex::new(Vec::new());

/// `ctx`, or the calling thread's current context when `ctx` is NULL.
fn resolve_ctx(ctx: CUcontext) -> Result<usize, CUresult> {
    if !ctx.is_null() {
        return Ok(ctx as usize);
    }
    let cur = sim::current_context();
    if cur.is_null() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(cur as usize)
}

unsafe extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: ClsDestructor,
) -> CUresult {
    guard(|| {
        let ctx = match resolve_ctx(ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        trace(format_args!(
            "CONTEXT_LOCAL_STORAGE put(ctx=0x{ctx:x}, key={key:p}, value={value:p})"
        ));
        let mut cls = CLS.lock();
        let (key, value) = (key as usize, value as usize);
        match cls.iter_mut().find(|e| e.ctx == ctx && e.key == key) {
            Some(e) => {
                e.value = value;
                e.dtor = dtor;
            }
            None => cls.push(ClsEntry {
                ctx,
                key,
                value,
                dtor,
            }),
        }
        CUDA_SUCCESS
    })
}

unsafe extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        let ctx = match resolve_ctx(ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        trace(format_args!(
            "CONTEXT_LOCAL_STORAGE delete(ctx=0x{ctx:x}, key={key:p})"
        ));
        CLS.lock().retain(|e| !(e.ctx == ctx && e.key == key as usize));
        CUDA_SUCCESS
    })
}

unsafe extern "C" fn cls_get(value: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let ctx = match resolve_ctx(ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let found = CLS
            .lock()
            .iter()
            .find(|e| e.ctx == ctx && e.key == key as usize)
            .map(|e| e.value);
        trace(format_args!(
            "CONTEXT_LOCAL_STORAGE get(ctx=0x{ctx:x}, key={key:p}) -> {found:x?}"
        ));
        match found {
            Some(v) => {
                // SAFETY: checked non-NULL; the runtime passes a pointer slot.
                unsafe { *value = v as *mut c_void };
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    unk::<T_CLS, 3>(),
]);

/// A context is going away (primary-context reset, `cuCtxDestroy`): forget its storage and run the runtime's
/// destructors. Call without holding simulator locks: the destructors may call back into the driver.
pub(crate) fn context_destroyed(ctx: *mut c_void) {
    let ctx = ctx as usize;
    let gone: Vec<ClsEntry> = {
        let mut cls = CLS.lock();
        let mut gone = Vec::new();
        let mut i = 0;
        while i < cls.len() {
            if cls[i].ctx == ctx {
                gone.push(cls.swap_remove(i));
            } else {
                i += 1;
            }
        }
        gone
    };
    for e in gone {
        trace(format_args!(
            "CONTEXT_LOCAL_STORAGE destructor(ctx=0x{:x}, key=0x{:x})",
            e.ctx, e.key
        ));
        if let Some(dtor) = e.dtor {
            // SAFETY: the runtime registered this destructor for exactly these arguments.
            let _ = catch_unwind(|| unsafe {
                dtor(e.ctx as CUcontext, e.key as *mut c_void, e.value as *mut c_void)
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Context checks
// ---------------------------------------------------------------------------------------------------------

/// Slot 2: `(ctx, u32 *flags, const void **extra)`; the runtime expects no flag set.
unsafe extern "C" fn context_check(_ctx: CUcontext, flags: *mut u32, _extra: *mut *const c_void) -> CUresult {
    if !flags.is_null() {
        // SAFETY: checked non-NULL; the runtime passes a u32 slot.
        unsafe { *flags = 0 };
    }
    CUDA_SUCCESS
}

/// Slot 3: returns a plain 0.
extern "C" fn context_check_3() -> u32 {
    0
}

static CONTEXT_CHECKS: Table<4> = Table([
    size_word(4),
    unk::<T_CHECKS, 1>(),
    context_check as *const c_void,
    context_check_3 as *const c_void,
]);

// ---------------------------------------------------------------------------------------------------------
// Integrity check
// ---------------------------------------------------------------------------------------------------------

static INTEGRITY_CHECK: Table<3> = Table([
    size_word(3),
    integrity_check as *const c_void,
    unk::<T_INTEGRITY, 2>(),
]);

/// The fixed 16-byte HMAC key (the result of a first pass over no input, as documented by ZLUDA).
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// The runtime calls slot 1 three times with `version` = its own version × 10 + 0, 1, 2. The first two answers
/// are constants; the third is the keyed hash.
const INTEGRITY_CONST_0: [u64; 2] = [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8];
const INTEGRITY_CONST_1: [u64; 2] = [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8];

fn driver_version() -> i32 {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    let _ = unsafe { sim::cuDriverGetVersion(&mut v) };
    v
}

/// What each device contributes to the hash: its UUID and PCI location, read through the public API so the
/// answer agrees with what the runtime reads.
fn device_hash_records() -> Result<Vec<[u8; 28]>, CUresult> {
    let mut count: c_int = 0;
    // SAFETY: valid out-pointer.
    let r = unsafe { sim::cuDeviceGetCount(&mut count) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    (0..count)
        .map(|dev| {
            let mut rec = [0u8; 28];
            let mut uuid = [0u8; 16];
            // SAFETY: valid out-pointer.
            let r = unsafe { sim::cuDeviceGetUuid(&mut uuid, dev) };
            if r != CUDA_SUCCESS {
                return Err(r);
            }
            rec[..16].copy_from_slice(&uuid);
            let attrs = [
                sim::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
                sim::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                sim::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
            ];
            for (i, attr) in attrs.into_iter().enumerate() {
                let mut v: c_int = 0;
                // SAFETY: valid out-pointer.
                let r = unsafe { sim::cuDeviceGetAttribute(&mut v, attr, dev) };
                if r != CUDA_SUCCESS {
                    return Err(r);
                }
                rec[16 + 4 * i..20 + 4 * i].copy_from_slice(&v.to_ne_bytes());
            }
            Ok(rec)
        })
        .collect()
}

/// The hash proper: HMAC-MD2 over a 48-byte header then one 28-byte record per device.
#[allow(clippy::too_many_arguments)]
fn integrity_hash(
    driver_version: u32,
    version: u32,
    pid: u32,
    tid: u32,
    cudart_table: usize,
    integrity_table: usize,
    fn_address: usize,
    unix_seconds: u64,
    devices: &[[u8; 28]],
) -> [u64; 2] {
    let mut header = Vec::with_capacity(48);
    for w in [driver_version, version, pid, tid] {
        header.extend_from_slice(&w.to_ne_bytes());
    }
    for p in [
        cudart_table as u64,
        integrity_table as u64,
        fn_address as u64,
        unix_seconds,
    ] {
        header.extend_from_slice(&p.to_ne_bytes());
    }
    let mut parts: Vec<&[u8]> = vec![&header];
    parts.extend(devices.iter().map(|d| &d[..]));
    let digest = md2::hmac_md2(&INTEGRITY_KEY, &parts);
    let (lo, hi) = digest.split_at(8);
    [
        u64::from_ne_bytes(lo.try_into().unwrap_or([0; 8])),
        u64::from_ne_bytes(hi.try_into().unwrap_or([0; 8])),
    ]
}

unsafe extern "C" fn integrity_check(version: c_uint, unix_seconds: u64, out: *mut [u64; 2]) -> CUresult {
    guard(|| {
        if out.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let result = match version % 10 {
            0 => INTEGRITY_CONST_0,
            1 => INTEGRITY_CONST_1,
            _ => {
                let devices = match device_hash_records() {
                    Ok(d) => d,
                    Err(e) => return e,
                };
                // SAFETY: pthread_self has no preconditions.
                let tid = unsafe { libc::pthread_self() } as u32;
                integrity_hash(
                    driver_version() as u32,
                    version,
                    std::process::id(),
                    tid,
                    cudart_interface() as usize,
                    INTEGRITY_CHECK.0.as_ptr() as usize,
                    INTEGRITY_CHECK.0[1] as usize,
                    unix_seconds,
                    &devices,
                )
            }
        };
        trace(format_args!(
            "INTEGRITY_CHECK[1](version={version}, time={unix_seconds}) -> {result:x?}"
        ));
        // SAFETY: checked non-NULL; the runtime passes a 16-byte slot.
        unsafe { *out = result };
        CUDA_SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_byte_order_matches_text() {
        assert_eq!(UUID_CUDART_INTERFACE[..4], [0x6b, 0xd5, 0xfb, 0x6c]);
        assert_eq!(UUID_CONTEXT_LOCAL_STORAGE[4..8], [0x11, 0x21, 0xdf, 0x11]);
    }

    #[test]
    fn size_words() {
        assert_eq!(CUDART_INTERFACE_13.0[0] as usize, 104);
        assert_eq!(CUDART_INTERFACE_12.0[0] as usize, 80);
        assert_eq!(CALLBACK_HOOKS.0[0] as usize, 56);
    }

    #[test]
    fn hash_depends_on_every_input() {
        let dev = [[7u8; 28]];
        let base = integrity_hash(13000, 13002, 1, 2, 3, 4, 5, 6, &dev);
        assert_ne!(base, integrity_hash(13000, 13002, 1, 2, 3, 4, 5, 7, &dev));
        assert_ne!(base, integrity_hash(13000, 13002, 1, 2, 3, 4, 5, 6, &[[8u8; 28]]));
        assert_eq!(base, integrity_hash(13000, 13002, 1, 2, 3, 4, 5, 6, &dev));
    }
}
