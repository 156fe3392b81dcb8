//! The few NVML calls the tool needs, from the real `libnvidia-ml.so.1` (or `CUQUOTA_LIBNVML`; the simulator's
//! in tests): devices by index and UUID, per-process device memory (the compute, graphics and MPS compute
//! process lists, `nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v3`) and per-process SM utilisation (`nvmlDeviceGetProcessUtilization`). Loaded with `dlopen` at run time, so the
//! tool works (without NVML figures) on a machine with no driver. Signatures and layouts: nvml.h 13.0.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr, CString};

type Ret = c_uint;
type Device = *mut c_void;

const SUCCESS: Ret = 0;
const ERROR_NOT_SUPPORTED: Ret = 3;
const ERROR_NOT_FOUND: Ret = 6;
const ERROR_INSUFFICIENT_SIZE: Ret = 7;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUF: usize = 96;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), what `_v3` fills.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UtilSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

const _: () = {
    assert!(std::mem::size_of::<Memory>() == 24);
    assert!(std::mem::size_of::<ProcessInfo>() == 24);
    assert!(std::mem::size_of::<UtilSample>() == 32);
    assert!(std::mem::size_of::<Utilization>() == 8);
};

type FnInit = unsafe extern "C" fn() -> Ret;
type FnErrorString = unsafe extern "C" fn(Ret) -> *const c_char;
type FnCount = unsafe extern "C" fn(*mut c_uint) -> Ret;
type FnByIndex = unsafe extern "C" fn(c_uint, *mut Device) -> Ret;
type FnUuid = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret;
type FnMemory = unsafe extern "C" fn(Device, *mut Memory) -> Ret;
type FnUtilization = unsafe extern "C" fn(Device, *mut Utilization) -> Ret;
type FnProcesses = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> Ret;
type FnProcessUtil = unsafe extern "C" fn(Device, *mut UtilSample, *mut c_uint, c_ulonglong) -> Ret;

struct Fns {
    init: FnInit,
    shutdown: FnInit,
    error_string: FnErrorString,
    count: FnCount,
    by_index: FnByIndex,
    uuid: FnUuid,
    memory: FnMemory,
    utilization: FnUtilization,
    /// The compute, graphics and MPS compute process lists, with their names.
    lists: [(FnProcesses, &'static str); 3],
    process_util: FnProcessUtil,
}

/// One GPU as NVML sees it (every physical device; `CUDA_VISIBLE_DEVICES` does not apply).
#[derive(Debug, Clone)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Device memory, bytes.
    pub memory_total_bytes: u64,
    /// Device memory in use (all processes), bytes.
    pub memory_used_bytes: u64,
    /// Percent of the last sample period with a kernel running, if NVML reports it.
    pub utilization_percent: Option<u32>,
    handle: Device,
}

/// An initialised NVML. Not `Send`: keep it on the thread that loaded it.
pub struct Nvml {
    f: Fns,
    what: String,
}

impl Nvml {
    /// Loads `CUQUOTA_LIBNVML` or `libnvidia-ml.so.1` and calls `nvmlInit_v2`.
    pub fn load() -> Result<Nvml, String> {
        let path = std::env::var_os("CUQUOTA_LIBNVML")
            .filter(|p| !p.is_empty())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into());
        Nvml::load_path(&path)
    }

    /// Loads the NVML library `path` (a soname or a file) and calls `nvmlInit_v2`.
    pub fn load_path(path: &str) -> Result<Nvml, String> {
        let path = path.to_string();
        let c = CString::new(path.clone()).map_err(|_| format!("bad NVML path {path:?}"))?;
        // SAFETY: a NUL-terminated path; the handle is never closed (NVML keeps threads and state).
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "not found".into()
            } else {
                // SAFETY: non-NULL, NUL-terminated (above).
                unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
            };
            return Err(format!("cannot load {path}: {why}"));
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let n = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: lib is a live handle, n NUL-terminated.
            let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
            if p.is_null() {
                Err(format!("{path} has no {name}"))
            } else {
                Ok(p)
            }
        };
        macro_rules! f {
            ($name:literal, $t:ty) => {
                // SAFETY: the symbol has the signature nvml.h (13.0) declares for `$name`, which `$t` spells.
                unsafe { std::mem::transmute::<*mut c_void, $t>(sym($name)?) }
            };
        }
        let f = Fns {
            init: f!("nvmlInit_v2", FnInit),
            shutdown: f!("nvmlShutdown", FnInit),
            error_string: f!("nvmlErrorString", FnErrorString),
            count: f!("nvmlDeviceGetCount_v2", FnCount),
            by_index: f!("nvmlDeviceGetHandleByIndex_v2", FnByIndex),
            uuid: f!("nvmlDeviceGetUUID", FnUuid),
            memory: f!("nvmlDeviceGetMemoryInfo", FnMemory),
            utilization: f!("nvmlDeviceGetUtilizationRates", FnUtilization),
            lists: [
                (
                    f!("nvmlDeviceGetComputeRunningProcesses_v3", FnProcesses),
                    "nvmlDeviceGetComputeRunningProcesses_v3",
                ),
                (
                    f!("nvmlDeviceGetGraphicsRunningProcesses_v3", FnProcesses),
                    "nvmlDeviceGetGraphicsRunningProcesses_v3",
                ),
                (
                    f!("nvmlDeviceGetMPSComputeRunningProcesses_v3", FnProcesses),
                    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                ),
            ],
            process_util: f!("nvmlDeviceGetProcessUtilization", FnProcessUtil),
        };
        let nvml = Nvml { f, what: path };
        // SAFETY: no arguments.
        nvml.check("nvmlInit_v2", unsafe { (nvml.f.init)() })?;
        Ok(nvml)
    }

    /// What was loaded (for messages).
    pub fn library(&self) -> &str {
        &self.what
    }

    fn check(&self, call: &str, r: Ret) -> Result<(), String> {
        if r == SUCCESS {
            return Ok(());
        }
        // SAFETY: nvmlErrorString returns a static NUL-terminated string (or NULL).
        let s = unsafe { (self.f.error_string)(r) };
        let msg = if s.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: non-NULL static string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(format!("{call}: {msg} ({r})"))
    }

    /// Every device, in NVML index order.
    pub fn gpus(&self) -> Result<Vec<Gpu>, String> {
        let mut n: c_uint = 0;
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetCount_v2", unsafe { (self.f.count)(&mut n) })?;
        (0..n).map(|i| self.gpu(i)).collect()
    }

    fn gpu(&self, index: u32) -> Result<Gpu, String> {
        let mut h: Device = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.f.by_index)(index, &mut h)
        })?;
        let mut buf = [0 as c_char; UUID_BUF];
        // SAFETY: buf holds UUID_BUF bytes.
        self.check("nvmlDeviceGetUUID", unsafe {
            (self.f.uuid)(h, buf.as_mut_ptr(), UUID_BUF as c_uint)
        })?;
        // SAFETY: NVML NUL-terminates within the buffer; the last byte is never written past.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut m = Memory::default();
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetMemoryInfo", unsafe { (self.f.memory)(h, &mut m) })?;
        let mut u = Utilization::default();
        // SAFETY: valid out-pointer.
        let util = (unsafe { (self.f.utilization)(h, &mut u) } == SUCCESS).then_some(u.gpu);
        Ok(Gpu {
            index,
            uuid,
            memory_total_bytes: m.total,
            memory_used_bytes: m.used,
            utilization_percent: util,
            handle: h,
        })
    }

    /// Processes on `gpu` in any of NVML's lists — compute, graphics, MPS compute — once each: (pid as NVML
    /// reports it, device memory bytes; a process in several lists counts its largest figure, NVML's
    /// `usedGpuMemory` being the process's). A process NVML reports without a memory figure
    /// (`NVML_VALUE_NOT_AVAILABLE`) counts 0 bytes. A list the GPU does not support (NOT_SUPPORTED) is empty;
    /// any other error fails the whole sample (fail closed: never judge from part of the lists).
    pub fn processes(&self, gpu: &Gpu) -> Result<Vec<(u32, u64)>, String> {
        let mut all: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, &(f, name)) in self.f.lists.iter().enumerate() {
            for (pid, bytes) in self.list(gpu, f, name, i > 0)? {
                let e = all.entry(pid).or_default();
                *e = (*e).max(bytes);
            }
        }
        Ok(all.into_iter().collect())
    }

    fn list(&self, gpu: &Gpu, f: FnProcesses, name: &str, optional: bool) -> Result<Vec<(u32, u64)>, String> {
        let mut cap: c_uint = 64;
        for _ in 0..4 {
            let mut buf = vec![ProcessInfo::default(); cap as usize];
            let mut n = cap;
            // SAFETY: buf holds `n` entries.
            let r = unsafe { f(gpu.handle, &mut n, buf.as_mut_ptr()) };
            if r == ERROR_INSUFFICIENT_SIZE {
                cap = n.max(cap) + 16; // processes may start between the two calls
                continue;
            }
            if optional && r == ERROR_NOT_SUPPORTED {
                return Ok(Vec::new());
            }
            self.check(name, r)?;
            buf.truncate(n as usize);
            return Ok(buf
                .iter()
                .map(|p| {
                    let bytes = if p.used_gpu_memory == u64::MAX {
                        0
                    } else {
                        p.used_gpu_memory
                    };
                    (p.pid, bytes)
                })
                .collect());
        }
        Err(format!("{name}: the process list keeps growing"))
    }

    /// SM utilisation per process on `gpu` from samples newer than `since_us` (CLOCK_REALTIME µs): pid → mean
    /// `smUtil` percent over that process's samples (NVML may return several per process). Empty when NVML
    /// has no sample in the window.
    pub fn process_utilization(&self, gpu: &Gpu, since_us: u64) -> Result<BTreeMap<u32, f64>, String> {
        let mut cap: c_uint = 256;
        for _ in 0..4 {
            let mut buf = vec![UtilSample::default(); cap as usize];
            let mut n = cap;
            // SAFETY: buf holds `n` entries.
            let r = unsafe { (self.f.process_util)(gpu.handle, buf.as_mut_ptr(), &mut n, since_us) };
            match r {
                ERROR_NOT_FOUND => return Ok(BTreeMap::new()),
                ERROR_INSUFFICIENT_SIZE => {
                    cap = n.max(cap) * 2;
                    continue;
                }
                _ => self.check("nvmlDeviceGetProcessUtilization", r)?,
            }
            buf.truncate(n as usize);
            let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
            for s in &buf {
                let e = sums.entry(s.pid).or_default();
                e.0 += f64::from(s.sm_util.min(100));
                e.1 += 1;
            }
            return Ok(sums
                .into_iter()
                .map(|(p, (sum, k))| (p, sum / f64::from(k)))
                .collect());
        }
        Err("nvmlDeviceGetProcessUtilization: the sample list keeps growing".into())
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balanced with the nvmlInit_v2 in load.
        unsafe {
            (self.f.shutdown)();
        }
    }
}

/// CLOCK_REALTIME in µs (NVML's sample timestamps).
pub fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
