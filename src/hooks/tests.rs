//! Hooks against a fake driver table: no real library, one fake GPU per test thread.

use crate::abi::cuda::body as hooks;
use crate::devices::Devices;
use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::memory::tests::{temp_path, TempRegion};
use crate::state::Shim;
use cuquota_core::region::{DeviceSelector, LimitsReader, LimitsRegion, LimitsWriter};
use cuquota_core::{Config, Policy, UsageRegion};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};

const MIB: u64 = 1 << 20;
const REAL_TOTAL: u64 = 16 << 30;

/// The fake GPU of the current test thread.
#[derive(Default)]
struct Fake {
    /// What every pool reports as `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    reserved: u64,
    next: u64,
    live: HashMap<u64, u64>,
    alloc_calls: u32,
    free_calls: u32,
}

thread_local! {
    static FAKE: RefCell<Fake> = RefCell::new(Fake { next: 0x7f00_0000_0000, ..Default::default() });
}

fn fake<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
    FAKE.with(|x| f(&mut x.borrow_mut()))
}

unsafe extern "C" fn f_ctx_get_device(d: *mut CUdevice) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { *d = 0 };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_uuid(u: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { (*u).bytes = [dev as u8 + 1; 16] };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_gran(
    g: *mut usize,
    _p: *const CUmemAllocationProp,
    _o: CUmemAllocationGranularity_flags,
) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { *g = 2 << 20 };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_alloc(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    fake(|f| {
        f.alloc_calls += 1;
        if size == 0 {
            return CUresult::ERROR_INVALID_VALUE;
        }
        let p = f.next;
        f.next += (size as u64).div_ceil(2 * MIB) * 2 * MIB;
        f.live.insert(p, size as u64);
        // SAFETY: test-owned out-pointer.
        unsafe { *dptr = p };
        CUresult::SUCCESS
    })
}
unsafe extern "C" fn f_free(dptr: CUdeviceptr) -> CUresult {
    fake(|f| {
        f.free_calls += 1;
        if f.live.remove(&dptr).is_some() {
            CUresult::SUCCESS
        } else {
            CUresult::ERROR_INVALID_VALUE
        }
    })
}
unsafe extern "C" fn f_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    w: usize,
    h: usize,
    _e: u32,
) -> CUresult {
    let p = w.div_ceil(256) * 256;
    // SAFETY: test-owned out-pointers.
    let r = unsafe { f_alloc(dptr, p * h) };
    // SAFETY: as above.
    unsafe { *pitch = p };
    r
}
unsafe extern "C" fn f_info(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        return CUresult::ERROR_INVALID_VALUE;
    }
    let used: u64 = fake(|f| f.live.values().sum());
    // SAFETY: checked non-NULL above.
    unsafe {
        *free = (REAL_TOTAL - used) as usize;
        *total = REAL_TOTAL as usize;
    }
    CUresult::SUCCESS
}
unsafe extern "C" fn f_get_proc(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    _v: c_int,
    _fl: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    // SAFETY: test-provided NUL-terminated name.
    let name = unsafe { CStr::from_ptr(sym) }.to_bytes();
    let p: *mut c_void = match name {
        b"cuMemAlloc" => f_alloc as *mut c_void,
        b"cuMemFree" => f_free as *mut c_void,
        b"cuMemcpy" => 0x1234 as *mut c_void,
        _ => std::ptr::null_mut(),
    };
    // SAFETY: test-owned out-pointers.
    unsafe {
        *pfn = p;
        *status = if p.is_null() { 1 } else { 0 };
    }
    if p.is_null() {
        CUresult::ERROR_NOT_FOUND
    } else {
        CUresult::SUCCESS
    }
}

unsafe extern "C" fn f_ipc_get(h: *mut CUipcMemHandle, p: CUdeviceptr) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { (*h).reserved = [p as u8 ^ 0x5a; 64] };
    CUresult::SUCCESS
}

unsafe extern "C" fn f_pool_attr(_p: CUmemoryPool, attr: CUmemPool_attribute, v: *mut c_void) -> CUresult {
    let r = fake(|f| f.reserved);
    // SAFETY: test-owned out-pointer of the attribute's type (cuuint64_t).
    unsafe {
        *(v as *mut u64) = if attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT {
            r
        } else {
            0
        }
    };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_free_async(_p: CUdeviceptr, _s: CUstream) -> CUresult {
    CUresult::SUCCESS
}
unsafe extern "C" fn f_pool_destroy(_p: CUmemoryPool) -> CUresult {
    CUresult::SUCCESS
}
unsafe extern "C" fn f_stream_sync(_s: CUstream) -> CUresult {
    CUresult::SUCCESS
}
unsafe extern "C" fn f_ctx_sync() -> CUresult {
    CUresult::SUCCESS
}

fn table() -> CudaTable {
    let mut t = CudaTable::empty(true);
    t.cuCtxGetDevice = Some(f_ctx_get_device);
    t.cuDeviceGetUuid_v2 = Some(f_uuid);
    t.cuMemGetAllocationGranularity = Some(f_gran);
    t.cuMemAlloc_v2 = Some(f_alloc);
    t.cuMemFree_v2 = Some(f_free);
    t.cuMemAllocPitch_v2 = Some(f_pitch);
    t.cuMemGetInfo_v2 = Some(f_info);
    t.cuGetProcAddress_v2 = Some(f_get_proc);
    t.cuIpcGetMemHandle = Some(f_ipc_get);
    t.cuMemPoolGetAttribute = Some(f_pool_attr);
    t.cuMemFreeAsync = Some(f_free_async);
    t.cuMemPoolDestroy = Some(f_pool_destroy);
    t.cuStreamSynchronize = Some(f_stream_sync);
    t.cuCtxSynchronize = Some(f_ctx_sync);
    t
}

struct Env {
    shim: Shim,
    _usage: TempRegion,
    _limits: Option<(TempRegion, LimitsWriter)>,
}

fn env(cap: Option<u64>) -> Env {
    let usage = temp_path("usage");
    let cfg = Config {
        default_limits: Policy {
            memory: cap,
            ..Policy::NONE
        },
        ..Default::default()
    };
    let region = UsageRegion::open(&usage.path).unwrap();
    let devices = Devices::new(cfg, region, Vec::new(), None);
    Env {
        shim: Shim::new(table(), None, devices, crate::abi::cuda::export_address),
        _usage: usage,
        _limits: None,
    }
}

fn alloc(s: &Shim, n: u64) -> (CUresult, CUdeviceptr) {
    let mut p: CUdeviceptr = 0;
    // SAFETY: valid out-pointer.
    let r = unsafe { hooks::cuMemAlloc_v2(s, &mut p, n as usize) };
    (r, p)
}

fn used(s: &Shim) -> u64 {
    let dev = s.devices.current(&s.cuda).unwrap();
    s.mem.allocs().container_used(dev)
}

#[test]
fn admission_refuses_over_cap_without_calling_the_driver() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    let (r, a) = alloc(s, 32 * MIB);
    assert_eq!(r, CUresult::SUCCESS);
    let calls = fake(|f| f.alloc_calls);
    let (r, _) = alloc(s, 40 * MIB);
    assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
    assert_eq!(
        fake(|f| f.alloc_calls),
        calls,
        "driver must not be called over the cap"
    );
    assert_eq!(used(s), 32 * MIB);
    // SAFETY: plain value.
    assert_eq!(unsafe { hooks::cuMemFree_v2(s, a) }, CUresult::SUCCESS);
    assert_eq!(used(s), 0);
    assert_eq!(alloc(s, 40 * MIB).0, CUresult::SUCCESS);
}

#[test]
fn driver_failure_after_admission_leaks_nothing() {
    let e = env(Some(64 * MIB));
    let (r, _) = alloc(&e.shim, 0);
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    assert_eq!(used(&e.shim), 0);
}

#[test]
fn sizes_are_rounded_to_granularity() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    assert_eq!(alloc(s, 1).0, CUresult::SUCCESS);
    assert_eq!(used(s), 2 * MIB);
    assert_eq!(alloc(s, 2 * MIB + 1).0, CUresult::SUCCESS);
    assert_eq!(used(s), 6 * MIB);
}

#[test]
fn pitch_charges_pitch_times_height() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    let (mut p, mut pitch) = (0u64, 0usize);
    // SAFETY: valid out-pointers.
    let r = unsafe { hooks::cuMemAllocPitch_v2(s, &mut p, &mut pitch, 1000, 5000, 4) };
    assert_eq!(r, CUresult::SUCCESS);
    assert_eq!(pitch, 1024);
    assert_eq!(used(s), (1024u64 * 5000).div_ceil(2 * MIB) * 2 * MIB);
    // SAFETY: plain value.
    assert_eq!(unsafe { hooks::cuMemFree_v2(s, p) }, CUresult::SUCCESS);
    assert_eq!(used(s), 0);
}

#[test]
fn untracked_free_goes_to_the_driver_unchanged() {
    let e = env(Some(64 * MIB));
    let before = fake(|f| f.free_calls);
    // SAFETY: plain value.
    let r = unsafe { hooks::cuMemFree_v2(&e.shim, 0xdead_0000) };
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE, "the driver's own answer");
    assert_eq!(fake(|f| f.free_calls), before + 1);
}

#[test]
fn proc_address_maps_hooked_pointers_and_passes_others() {
    let e = env(None);
    let s = &e.shim;
    let get = |name: &CStr| {
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut st = CUdriverProcAddressQueryResult::MAX;
        // SAFETY: valid pointers.
        let r = unsafe { hooks::cuGetProcAddress_v2(s, name.as_ptr(), &mut p, 13000, 0, &mut st) };
        (r, p as usize, st)
    };
    let (r, p, st) = get(c"cuMemAlloc");
    assert_eq!((r, st), (CUresult::SUCCESS, 0));
    assert_eq!(p, crate::abi::cuda::cuMemAlloc_v2 as *const () as usize);
    let (_, p, _) = get(c"cuMemFree");
    assert_eq!(p, crate::abi::cuda::cuMemFree_v2 as *const () as usize);
    let (r, p, _) = get(c"cuMemcpy");
    assert_eq!((r, p), (CUresult::SUCCESS, 0x1234));
    let (r, p, st) = get(c"cuNoSuchThing");
    assert_eq!((r, p, st), (CUresult::ERROR_NOT_FOUND, 0, 1));
}

#[test]
fn mem_get_info_tolerates_null_out_pointers() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    alloc(s, 10 * MIB);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid or NULL pointers.
    unsafe {
        assert_eq!(
            hooks::cuMemGetInfo_v2(s, std::ptr::null_mut(), &mut total),
            CUresult::SUCCESS
        );
        assert_eq!(
            hooks::cuMemGetInfo_v2(s, &mut free, std::ptr::null_mut()),
            CUresult::SUCCESS
        );
        // both NULL: whatever the driver says for that
        assert_eq!(
            hooks::cuMemGetInfo_v2(s, std::ptr::null_mut(), std::ptr::null_mut()),
            CUresult::ERROR_INVALID_VALUE
        );
    }
    assert_eq!(total as u64, 64 * MIB);
    assert_eq!(free as u64, 54 * MIB);
}

#[test]
fn no_limit_means_pass_through_info() {
    let e = env(None);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid pointers.
    unsafe { hooks::cuMemGetInfo_v2(&e.shim, &mut free, &mut total) };
    assert_eq!(total as u64, REAL_TOTAL);
    // but usage is still recorded for the container
    alloc(&e.shim, 4 * MIB);
    assert_eq!(used(&e.shim), 4 * MIB);
}

#[test]
fn limits_file_change_is_picked_up() {
    let usage = temp_path("usage");
    let lim = temp_path("limits");
    let writer = LimitsWriter::create(&lim.path).unwrap();
    let uuid = [1u8; 16]; // f_uuid gives ordinal 0 this UUID
    let set = |bytes| {
        writer
            .update(|t| {
                t.entry_mut(DeviceSelector::Uuid(uuid)).unwrap().memory_limit = bytes;
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap()
    };
    set(64 * MIB);
    let readers = vec![(
        LimitsReader::open(&lim.path).unwrap(),
        LimitsRegion::open(&lim.path).unwrap(),
    )];
    // env says 1 GiB: the agent's 64 MiB wins (the lower)
    let cfg = Config {
        default_limits: Policy {
            memory: Some(1 << 30),
            ..Policy::NONE
        },
        ..Default::default()
    };
    let devices = Devices::new(cfg, UsageRegion::open(&usage.path).unwrap(), readers, None);
    let s = Shim::new(table(), None, devices, crate::abi::cuda::export_address);
    assert_eq!(alloc(&s, 40 * MIB).0, CUresult::SUCCESS);
    assert_eq!(alloc(&s, 40 * MIB).0, CUresult::ERROR_OUT_OF_MEMORY);
    set(128 * MIB);
    assert_eq!(
        alloc(&s, 40 * MIB).0,
        CUresult::SUCCESS,
        "raised limit seen on the next call"
    );
    set(32 * MIB);
    assert_eq!(
        alloc(&s, 2 * MIB).0,
        CUresult::ERROR_OUT_OF_MEMORY,
        "lowered limit seen"
    );
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid pointers.
    unsafe { hooks::cuMemGetInfo_v2(&s, &mut free, &mut total) };
    assert_eq!((free as u64, total as u64), (0, 32 * MIB));
}

/// The launch exports' pass-through (`abi::launch_unhooked`): taken while no limit applies to launches and the
/// one limits file is unchanged; a write to that file sends launches to the hook before anything re-read it,
/// and a second file, a memory cap or an SM limit keep them there.
#[test]
fn launch_pass_through_follows_the_limits_files() {
    let usage = temp_path("usage");
    let lim = temp_path("limits");
    let writer = LimitsWriter::create(&lim.path).unwrap();
    let set_sm = |pct| {
        writer
            .update(|t| {
                let e = t.entry_mut(DeviceSelector::All).unwrap();
                e.sm_limit = pct;
                e.policy = cuquota_core::region::layout::POLICY_HARD;
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap()
    };
    set_sm(0);
    let open = |p: &std::path::Path| (LimitsReader::open(p).unwrap(), LimitsRegion::open(p).unwrap());
    let devices =
        |files: Vec<_>, cfg: Config| Devices::new(cfg, UsageRegion::open(&usage.path).unwrap(), files, None);
    let d = devices(vec![open(&lim.path)], Config::default());
    assert!(d.launch_unhooked(), "no limit, one unchanged file");
    set_sm(20);
    assert!(!d.launch_unhooked(), "the file changed: the hook re-reads it");
    assert!(d.launch_hooked(), "the hook sees the new SM limit");
    assert!(!d.launch_unhooked());
    set_sm(0);
    assert!(!d.launch_hooked(), "limit lifted");
    assert!(d.launch_unhooked());

    let other = temp_path("limits2");
    LimitsWriter::create(&other.path).unwrap();
    let two = devices(vec![open(&lim.path), open(&other.path)], Config::default());
    assert!(!two.launch_hooked());
    assert!(
        !two.launch_unhooked(),
        "two files: always the hook, which checks both"
    );

    let capped = Config {
        default_limits: Policy {
            memory: Some(1 << 30),
            ..Policy::NONE
        },
        ..Default::default()
    };
    assert!(
        !devices(Vec::new(), capped).launch_unhooked(),
        "a memory cap: first launches are admitted"
    );
    assert!(
        devices(Vec::new(), Config::default()).launch_unhooked(),
        "no file, no limit"
    );
}

#[test]
fn missing_driver_symbol_is_not_found_and_missing_library_not_initialized() {
    let t = CudaTable::empty(true);
    // SAFETY: the table has no function: no pointer is used.
    let r = unsafe { t.cuMemAlloc_v2(std::ptr::null_mut(), 1) };
    assert_eq!(r, CUresult::ERROR_NOT_FOUND);
    let t = CudaTable::empty(false);
    // SAFETY: as above.
    assert_eq!(unsafe { t.cuInit(0) }, CUresult::ERROR_NOT_INITIALIZED);
}

#[test]
fn array_estimates() {
    use crate::hooks::memory::array_estimate;
    // 1024×1024 float4
    assert_eq!(array_estimate(1024, 1024, 1, 0x20, 4, 0, 1), 16 * MIB);
    // full mip chain of a 1024² RGBA8 ≈ 4/3
    let m = array_estimate(1024, 1024, 1, 0x01, 4, 0, 11);
    assert!(m > 4 * MIB && m < 4 * MIB * 4 / 3 + 4096, "{m}");
    // deferred-mapping arrays take no memory at creation
    assert_eq!(array_estimate(1024, 1024, 1, 0x20, 4, 0x80, 1), 0);
}

// ---- NVML ---------------------------------------------------------------------------------------------------

use crate::driver::nvml::NvmlTable;
use crate::ffi::nvml::*;

unsafe extern "C" fn n_procs(
    _d: nvmlDevice_t,
    count: *mut u32,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    let me = std::process::id();
    let all = [me, 1, 999_999];
    // SAFETY: test-owned pointers, NVML's size protocol.
    unsafe {
        let room = *count as usize;
        if infos.is_null() && room > 0 {
            return nvmlReturn_t::ERROR_INVALID_ARGUMENT; // as the real NVML
        }
        *count = all.len() as u32;
        if room < all.len() || infos.is_null() {
            return nvmlReturn_t::ERROR_INSUFFICIENT_SIZE;
        }
        for (i, pid) in all.iter().enumerate() {
            *infos.add(i) = nvmlProcessInfo_v2_t {
                pid: *pid,
                usedGpuMemory: 100 << 20,
                ..Default::default()
            };
        }
    }
    nvmlReturn_t::SUCCESS
}

#[test]
fn nvml_process_list_shows_only_the_container_with_size_protocol() {
    let usage = temp_path("usage");
    let devices = Devices::new(
        Config::default(),
        UsageRegion::open(&usage.path).unwrap(),
        Vec::new(),
        None,
    );
    let mut n = NvmlTable::empty(true);
    n.nvmlDeviceGetComputeRunningProcesses_v3 = Some(n_procs);
    let s = Shim::new(table(), Some(n), devices, crate::abi::cuda::export_address);
    s.devices.usage().process_slot().unwrap(); // this process is a member of the container
    let dev = 0x1 as nvmlDevice_t;
    let list = |count: &mut u32, buf: *mut nvmlProcessInfo_v2_t| {
        // SAFETY: the pointers the protocol case under test hands in.
        unsafe { crate::abi::nvml::body::nvmlDeviceGetComputeRunningProcesses_v3(&s, dev, count, buf) }
    };
    // size query: NULL buffer, 0 room → INSUFFICIENT_SIZE with the *filtered* count
    let mut count = 0u32;
    let r = list(&mut count, std::ptr::null_mut());
    assert_eq!((r, count), (nvmlReturn_t::ERROR_INSUFFICIENT_SIZE, 1));
    // NULL buffer with room claimed: the real library's own answer (INVALID_ARGUMENT), not a size query
    count = 4;
    let r = list(&mut count, std::ptr::null_mut());
    assert_eq!(r, nvmlReturn_t::ERROR_INVALID_ARGUMENT);
    let mut buf = [nvmlProcessInfo_v2_t::default(); 4];
    count = 4;
    // SAFETY: buffer of `count` records.
    let r = unsafe {
        crate::abi::nvml::body::nvmlDeviceGetComputeRunningProcesses_v3(&s, dev, &mut count, buf.as_mut_ptr())
    };
    assert_eq!((r, count), (nvmlReturn_t::SUCCESS, 1));
    assert_eq!(buf[0].pid, std::process::id());
}

/// Fills every device entry of the usage region with other GPUs, so device 0 finds no room.
fn fill_device_entries(s: &Shim) {
    for i in 0..cuquota_core::region::layout::MAX_DEVICES as u8 {
        s.devices.usage().device(&[200 + i; 16]).expect("claim");
    }
}

/// An allocation is refused without the driver being asked.
fn refused_before_the_driver(s: &Shim, what: &str) {
    let calls = fake(|f| f.alloc_calls);
    assert_eq!(alloc(s, 2 * MIB).0, CUresult::ERROR_OUT_OF_MEMORY);
    assert_eq!(fake(|f| f.alloc_calls), calls, "{what} reached the driver");
}

#[test]
fn a_device_without_room_in_the_region_is_refused_when_limited() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    fill_device_entries(s);
    refused_before_the_driver(s, "an unaccounted allocation");
}

#[test]
fn a_device_without_room_passes_through_when_nothing_is_limited() {
    let e = env(None);
    let s = &e.shim;
    fill_device_entries(s);
    assert_eq!(alloc(s, 2 * MIB).0, CUresult::SUCCESS);
}

unsafe extern "C" fn f_ctx_get_device_64(d: *mut CUdevice) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { *d = crate::devices::MAX_ORDINALS as CUdevice };
    CUresult::SUCCESS
}

#[test]
fn a_device_beyond_the_tracked_ordinals_is_refused_when_limited() {
    let mut e = env(Some(64 * MIB));
    e.shim.cuda.cuCtxGetDevice = Some(f_ctx_get_device_64);
    refused_before_the_driver(&e.shim, "an allocation on an untracked ordinal");
}

unsafe extern "C" fn f_pool_create(pool: *mut CUmemoryPool, _props: *const CUmemPoolProps) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { *pool = 0x5000 as CUmemoryPool };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_alloc_from_pool(
    dptr: *mut CUdeviceptr,
    size: usize,
    _pool: CUmemoryPool,
    _stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded test-owned out-pointer.
    unsafe { f_alloc(dptr, size) }
}

#[test]
fn a_device_pool_without_room_in_the_region_is_not_a_host_pool() {
    let mut e = env(Some(64 * MIB));
    e.shim.cuda.cuMemPoolCreate = Some(f_pool_create);
    e.shim.cuda.cuMemAllocFromPoolAsync = Some(f_alloc_from_pool);
    let s = &e.shim;
    fill_device_entries(s);
    let props = CUmemPoolProps {
        allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: 0,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { hooks::cuMemPoolCreate(s, &mut pool, &props) },
        CUresult::SUCCESS
    );
    let calls = fake(|f| f.alloc_calls);
    let mut p: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the fake ignores the stream.
    let r =
        unsafe { hooks::cuMemAllocFromPoolAsync(s, &mut p, (2 * MIB) as usize, pool, std::ptr::null_mut()) };
    assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
    assert_eq!(
        fake(|f| f.alloc_calls),
        calls,
        "an unaccounted pool allocation reached the driver"
    );
}

unsafe extern "C" fn f_ctx_create(pctx: *mut CUcontext, _flags: u32, _dev: CUdevice) -> CUresult {
    // SAFETY: test-owned out-pointer.
    unsafe { *pctx = 0xc0de as CUcontext };
    CUresult::SUCCESS
}
unsafe extern "C" fn f_ctx_destroy(_ctx: CUcontext) -> CUresult {
    // The driver frees every allocation made in the context.
    fake(|f| f.live.clear());
    CUresult::SUCCESS
}

#[test]
fn destroying_the_last_context_releases_its_allocations() {
    let mut e = env(Some(1 << 30));
    e.shim.cuda.cuCtxCreate_v2 = Some(f_ctx_create);
    e.shim.cuda.cuCtxDestroy_v2 = Some(f_ctx_destroy);
    let s = &e.shim;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { hooks::cuCtxCreate_v2(s, &mut ctx, 0, 0) };
    assert_eq!(r, CUresult::SUCCESS);
    let (r, a) = alloc(s, 512 * MIB);
    assert_eq!(r, CUresult::SUCCESS);
    // SAFETY: the context the fake handed out.
    assert_eq!(unsafe { hooks::cuCtxDestroy_v2(s, ctx) }, CUresult::SUCCESS);
    assert_eq!(used(s), 0, "the destroyed context's memory is still charged");
    // A stale free of the dead allocation goes to the driver (which refuses it) and changes nothing.
    // SAFETY: plain value.
    let r = unsafe { hooks::cuMemFree_v2(s, a) };
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    // SAFETY: valid out-pointer.
    let r = unsafe { hooks::cuCtxCreate_v2(s, &mut ctx, 0, 0) };
    assert_eq!(r, CUresult::SUCCESS);
    assert_eq!(alloc(s, 512 * MIB).0, CUresult::SUCCESS, "a false out-of-memory");
}

#[test]
fn a_reused_address_releases_the_stale_record_charge() {
    let e = env(Some(64 * MIB));
    let s = &e.shim;
    let dev = s.devices.current(&s.cuda).unwrap();
    // An allocation freed behind the shim's back: record and charge remain, the address is free again.
    let next = fake(|f| f.next);
    let _ = s.mem.allocs().admit(dev, 32 * MIB, &s.cuda, &s.nvml).unwrap();
    let stale = crate::memory::Record {
        entry: dev.id,
        bytes: 32 * MIB,
        kind: crate::memory::Kind::Direct,
    };
    s.mem.allocs().record(crate::memory::Space::Pointer, next, stale);
    let (r, p) = alloc(s, 2 * MIB);
    assert_eq!((r, p), (CUresult::SUCCESS, next));
    assert_eq!(used(s), 2 * MIB, "the stale record's charge leaked");
}

#[test]
fn a_context_teardown_gives_back_only_what_this_process_still_charges() {
    // 384 MiB exported (its charge in the container's shared table, where an importer may hold it) and 128 MiB
    // that outlive the context (as VMM memory does): when the context goes, the exported allocation's charge
    // is not this process's to give back, and the 128 MiB stay charged.
    let e = env(Some(1 << 30));
    let s = &e.shim;
    let dev = s.devices.current(&s.cuda).unwrap();
    s.mem.allocs().force(dev, 128 * MIB);
    let (r, p) = alloc(s, 384 * MIB);
    assert_eq!(r, CUresult::SUCCESS);
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: valid out-pointer.
    let r = unsafe { hooks::cuIpcGetMemHandle(s, &mut h, p) };
    assert_eq!(r, CUresult::SUCCESS);
    assert_eq!(used(s), 512 * MIB);
    s.mem.first_use().context_gone(&s.cuda, dev);
    // This process has let go; nobody else holds the entry here, so it went with it.
    assert_eq!(used(s), 128 * MIB);
}

#[test]
fn a_destroyed_pool_stays_charged_until_its_frees_have_run() {
    // cuda.h: a destroyed pool's resources go back once its frees have completed. A tenant that frees into a
    // pool on a stream that never runs (a host function that never returns) and destroys it must not get the
    // memory's charge back while the driver still holds it.
    use crate::memory::{Kind, PoolCall, Record, Space};
    let e = env(Some(1 << 30));
    let s = &e.shim;
    let dev = s.devices.current(&s.cuda).unwrap();
    for (n, by_context) in [(0x5000usize, false), (0x6000, true)] {
        // Made (as cuMemPoolCreate would) and trimmed: its reserve is read.
        let made = PoolCall::Create {
            on: Some(Some(dev)),
            out: &|| Some(n),
        };
        s.mem.pool(&s.cuda, &s.nvml, made, || CUresult::SUCCESS);
        fake(|f| f.reserved = 768 * MIB);
        s.mem
            .pool(&s.cuda, &s.nvml, PoolCall::Trim(n), || CUresult::SUCCESS);
        assert_eq!(used(s), 768 * MIB);
        let p = 0xa000 + n as u64;
        let rec = Record {
            entry: dev.id,
            bytes: 768 * MIB,
            kind: Kind::Pool(n),
        };
        s.mem.allocs().record(Space::Pointer, p, rec);
        let (blocked, other) = (0x7777 as CUstream, 0x8888 as CUstream);
        // SAFETY: plain values and handles the fake driver ignores (so below).
        let freed = unsafe { hooks::cuMemFreeAsync(s, p, blocked) };
        // SAFETY: as above.
        let destroyed = unsafe { hooks::cuMemPoolDestroy(s, n as CUmemoryPool) };
        assert!(freed.ok() && destroyed.ok());
        fake(|f| f.reserved = 0);
        assert_eq!(used(s), 768 * MIB, "released before its free ran");
        // SAFETY: as above.
        unsafe { assert!(hooks::cuStreamSynchronize(s, other).ok()) };
        assert_eq!(used(s), 768 * MIB, "another stream's synchronisation released it");
        // SAFETY: as above.
        unsafe {
            assert!(if by_context {
                hooks::cuCtxSynchronize(s)
            } else {
                hooks::cuStreamSynchronize(s, blocked)
            }
            .ok())
        };
        assert_eq!(used(s), 0);
    }
}

/// `Memory::creating`'s guard holds a context's estimate across the driver's call and gives it back when
/// dropped without `Creating::created`: the creation failed, or was never attempted (a panic, an early return).
#[test]
fn a_creation_dropped_unmade_gives_its_estimate_back() {
    use crate::memory::Creation;
    let e = env(Some(1 << 30));
    let s = &e.shim;
    let c = s
        .mem
        .overhead()
        .creating(&s.cuda, &s.nvml, Creation::Context(0))
        .unwrap();
    assert_eq!(
        used(s),
        256 * MIB,
        "the estimate is held while the call runs (control)"
    );
    drop(c);
    assert_eq!(used(s), 0, "a creation never made still holds its estimate");
    let mut c = s
        .mem
        .overhead()
        .creating(&s.cuda, &s.nvml, Creation::Module)
        .unwrap();
    assert_eq!(
        c.call(|| CUresult::ERROR_OUT_OF_MEMORY),
        CUresult::ERROR_OUT_OF_MEMORY
    );
    drop(c);
    assert_eq!(used(s), 0, "a failed load still holds its estimate");
}
