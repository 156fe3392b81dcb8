//! The few NVML calls the tool needs, from the real `libnvidia-ml.so.1` (or `CUQUOTA_LIBNVML`; the simulator's
//! in tests): devices by index and UUID, per-process device memory (the compute, graphics and MPS compute
//! process lists, `nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v3`) and per-process SM utilisation
//! (`nvmlDeviceGetProcessUtilization`). Loaded with `dlopen` at run time, so the tool works (without NVML
//! figures) on a machine with no driver. Signatures and layouts: [`crate::nvml`], checked against nvml.h.
//! Behind the `loader` feature, so that the preload library (which reads NVML through its own table) does not
//! build it. Used by the agent, the `cuquota` command and the DRA plugin.

use crate::nvml::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlMemory_t, nvmlProcessInfo_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlUtilization_t, NvmlTable, PFN_nvmlErrorString,
    NVML_DEVICE_UUID_BUFFER_SIZE as UUID_BUF, NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_void, CStr, CString};

/// Why an NVML call or the loading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    /// The library path has a NUL byte.
    #[error("bad NVML path {0:?}")]
    BadPath(String),
    /// `dlopen` failed (no driver on this machine, or `CUQUOTA_LIBNVML` names no library).
    #[error("cannot load {path}: {why}")]
    Load {
        /// What was opened.
        path: String,
        /// `dlerror`'s message.
        why: String,
    },
    /// The library lacks a function the tool calls (an NVML older than the tool supports).
    #[error("{path} has no {name}")]
    Missing {
        /// What was opened.
        path: String,
        /// The missing function.
        name: &'static str,
    },
    /// A GPU UUID with a NUL byte.
    #[error("bad GPU UUID {0:?}")]
    BadUuid(String),
    /// An NVML call failed: the call, NVML's message and status.
    #[error("{call}: {message} ({})", status.0)]
    Call {
        /// The NVML function.
        call: &'static str,
        /// Its status.
        status: nvmlReturn_t,
        /// `nvmlErrorString` of the status.
        message: String,
    },
    /// A list grew between the sizing call and the read, four times over.
    #[error("{call}: the {what} list keeps growing")]
    KeepsGrowing {
        /// The NVML function.
        call: &'static str,
        /// `process` or `sample`.
        what: &'static str,
    },
}

impl NvmlError {
    /// The status of a failed NVML call (`ERROR_GPU_IS_LOST` when the GPU fell off the bus).
    pub fn status(&self) -> Option<nvmlReturn_t> {
        match self {
            NvmlError::Call { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// One of NVML's process lists (compute, graphics, MPS compute), as a method of the table.
type ProcessList = unsafe fn(&NvmlTable, nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// The process lists, with their names.
const LISTS: [(ProcessList, &str); 3] = [
    (
        NvmlTable::nvmlDeviceGetComputeRunningProcesses_v3,
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ),
    (
        NvmlTable::nvmlDeviceGetGraphicsRunningProcesses_v3,
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    ),
    (
        NvmlTable::nvmlDeviceGetMPSComputeRunningProcesses_v3,
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    ),
];

/// The functions the tool calls (beside `nvmlErrorString`): a library without one of them is not loaded.
const REQUIRED: &[&str] = &[
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
];

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
    handle: nvmlDevice_t,
}

/// An initialised NVML. Not `Send`: keep it on the thread that loaded it.
#[derive(Debug)]
pub struct Nvml {
    f: NvmlTable,
    error_string: PFN_nvmlErrorString,
    what: String,
}

impl Nvml {
    /// Loads `CUQUOTA_LIBNVML` or `libnvidia-ml.so.1` and calls `nvmlInit_v2`.
    pub fn load() -> Result<Nvml, NvmlError> {
        let path = std::env::var_os("CUQUOTA_LIBNVML")
            .filter(|p| !p.is_empty())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into());
        Nvml::load_path(&path)
    }

    /// Loads the NVML library `path` (a soname or a file) and calls `nvmlInit_v2`.
    pub fn load_path(path: &str) -> Result<Nvml, NvmlError> {
        let path = path.to_string();
        let c = CString::new(path.clone()).map_err(|_| NvmlError::BadPath(path.clone()))?;
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
            return Err(NvmlError::Load { path, why });
        }
        let sym = |name: &CStr| {
            // SAFETY: lib is a live handle, name NUL-terminated.
            unsafe { libc::dlsym(lib, name.as_ptr()) }
        };
        // SAFETY: `sym` returns NULL or the address of that name in a library never closed.
        let f = unsafe { NvmlTable::load(sym) };
        let missing = |name: &'static str| NvmlError::Missing {
            path: path.clone(),
            name,
        };
        let resolved = f.resolved();
        if let Some(name) = REQUIRED.iter().find(|n| !resolved.iter().any(|(r, _)| r == *n)) {
            return Err(missing(name));
        }
        let error_string = sym(c"nvmlErrorString");
        if error_string.is_null() {
            return Err(missing("nvmlErrorString"));
        }
        // SAFETY: the address of nvmlErrorString, whose signature `PFN_nvmlErrorString` spells (checked against
        // nvml.h in cuquota-ffi).
        let error_string = unsafe { std::mem::transmute::<*mut c_void, PFN_nvmlErrorString>(error_string) };
        let nvml = Nvml {
            f,
            error_string,
            what: path,
        };
        // SAFETY: no arguments.
        nvml.check("nvmlInit_v2", unsafe { nvml.f.nvmlInit_v2() })?;
        Ok(nvml)
    }

    /// What was loaded (for messages).
    pub fn library(&self) -> &str {
        &self.what
    }

    fn check(&self, call: &'static str, r: nvmlReturn_t) -> Result<(), NvmlError> {
        if r.ok() {
            return Ok(());
        }
        // SAFETY: nvmlErrorString returns a static NUL-terminated string (or NULL).
        let s = unsafe { (self.error_string)(r) };
        let message = if s.is_null() {
            format!("error {}", r.0)
        } else {
            // SAFETY: non-NULL static string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(NvmlError::Call {
            call,
            status: r,
            message,
        })
    }

    /// Every device, in NVML index order.
    pub fn gpus(&self) -> Result<Vec<Gpu>, NvmlError> {
        let mut n: c_uint = 0;
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetCount_v2", unsafe {
            self.f.nvmlDeviceGetCount_v2(&mut n)
        })?;
        (0..n).map(|i| self.gpu(i)).collect()
    }

    fn gpu(&self, index: u32) -> Result<Gpu, NvmlError> {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            self.f.nvmlDeviceGetHandleByIndex_v2(index, &mut h)
        })?;
        let mut buf = [0 as c_char; UUID_BUF];
        // SAFETY: buf holds UUID_BUF bytes.
        self.check("nvmlDeviceGetUUID", unsafe {
            self.f.nvmlDeviceGetUUID(h, buf.as_mut_ptr(), UUID_BUF as c_uint)
        })?;
        // SAFETY: NVML NUL-terminates within the buffer; the last byte is never written past.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut m = nvmlMemory_t::default();
        // SAFETY: valid out-pointer.
        self.check("nvmlDeviceGetMemoryInfo", unsafe {
            self.f.nvmlDeviceGetMemoryInfo(h, &mut m)
        })?;
        let mut u = nvmlUtilization_t::default();
        // SAFETY: valid out-pointer.
        let util = unsafe { self.f.nvmlDeviceGetUtilizationRates(h, &mut u) }
            .ok()
            .then_some(u.gpu);
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
    pub fn processes(&self, gpu: &Gpu) -> Result<Vec<(u32, u64)>, NvmlError> {
        let mut all: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, &(f, name)) in LISTS.iter().enumerate() {
            for (pid, bytes) in self.list(gpu, f, name, i > 0)? {
                let e = all.entry(pid).or_default();
                *e = (*e).max(bytes);
            }
        }
        Ok(all.into_iter().collect())
    }

    fn list(
        &self,
        gpu: &Gpu,
        f: ProcessList,
        name: &'static str,
        optional: bool,
    ) -> Result<Vec<(u32, u64)>, NvmlError> {
        let mut cap: c_uint = 64;
        for _ in 0..4 {
            let mut buf = vec![nvmlProcessInfo_t::default(); cap as usize];
            let mut n = cap;
            // SAFETY: buf holds `n` entries.
            let r = unsafe { f(&self.f, gpu.handle, &mut n, buf.as_mut_ptr()) };
            if r == nvmlReturn_t::ERROR_INSUFFICIENT_SIZE {
                cap = n.max(cap) + 16; // processes may start between the two calls
                continue;
            }
            if optional && r == nvmlReturn_t::ERROR_NOT_SUPPORTED {
                return Ok(Vec::new());
            }
            self.check(name, r)?;
            buf.truncate(n as usize);
            return Ok(buf
                .iter()
                .map(|p| {
                    let bytes = if p.usedGpuMemory == u64::MAX {
                        0
                    } else {
                        p.usedGpuMemory
                    };
                    (p.pid, bytes)
                })
                .collect());
        }
        Err(NvmlError::KeepsGrowing {
            call: name,
            what: "process",
        })
    }

    /// SM utilisation per process on `gpu` from samples newer than `since_us` (CLOCK_REALTIME µs): pid → mean
    /// `smUtil` percent over that process's samples (NVML may return several per process). Empty when NVML
    /// has no sample in the window.
    pub fn process_utilization(&self, gpu: &Gpu, since_us: u64) -> Result<BTreeMap<u32, f64>, NvmlError> {
        let mut cap: c_uint = 256;
        for _ in 0..4 {
            let mut buf = vec![nvmlProcessUtilizationSample_t::default(); cap as usize];
            let mut n = cap;
            // SAFETY: buf holds `n` entries.
            let r = unsafe {
                self.f
                    .nvmlDeviceGetProcessUtilization(gpu.handle, buf.as_mut_ptr(), &mut n, since_us)
            };
            match r {
                nvmlReturn_t::ERROR_NOT_FOUND => return Ok(BTreeMap::new()),
                nvmlReturn_t::ERROR_INSUFFICIENT_SIZE => {
                    cap = n.max(cap) * 2;
                    continue;
                }
                _ => self.check("nvmlDeviceGetProcessUtilization", r)?,
            }
            buf.truncate(n as usize);
            let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
            for s in &buf {
                let e = sums.entry(s.pid).or_default();
                e.0 += f64::from(s.smUtil.min(100));
                e.1 += 1;
            }
            return Ok(sums
                .into_iter()
                .map(|(p, (sum, k))| (p, sum / f64::from(k)))
                .collect());
        }
        Err(NvmlError::KeepsGrowing {
            call: "nvmlDeviceGetProcessUtilization",
            what: "sample",
        })
    }
}

/// What a GPU is, as NVML describes it (each `None` where this NVML cannot say).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    /// `nvmlDeviceGetName`: `NVIDIA H100 80GB HBM3`.
    pub product_name: Option<String>,
    /// `nvmlDeviceGetArchitecture`, named as NVIDIA's DRA driver names it: `Hopper`.
    pub architecture: Option<String>,
    /// `nvmlDeviceGetCudaComputeCapability`: (major, minor).
    pub compute_capability: Option<(i32, i32)>,
    /// `nvmlDeviceGetPciInfo_v3`: (domain, bus, device).
    pub pci: Option<(u32, u32, u32)>,
}

/// The name of an `NVML_DEVICE_ARCH_*` value (nvml.h).
pub fn architecture_name(arch: c_uint) -> Option<&'static str> {
    Some(match arch {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        _ => return None,
    })
}

/// A NUL-terminated answer in `buf`, if NVML wrote one.
fn c_string(buf: &[c_char]) -> Option<String> {
    let end = buf.iter().position(|&c| c == 0)?;
    // SAFETY: c_char and u8 have one layout; `end` is within the buffer.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), end) };
    Some(String::from_utf8_lossy(bytes).into_owned()).filter(|s| !s.is_empty())
}

impl Nvml {
    /// The GPU's name, architecture, compute capability and PCI address; a call this NVML lacks or refuses
    /// leaves its field `None`.
    pub fn details(&self, gpu: &Gpu) -> Details {
        let mut name = [0 as c_char; 96]; // NVML_DEVICE_NAME_V2_BUFFER_SIZE
                                          // SAFETY: name holds 96 bytes.
        let product_name = unsafe { self.f.nvmlDeviceGetName(gpu.handle, name.as_mut_ptr(), 96) }
            .ok()
            .then(|| c_string(&name))
            .flatten();
        let mut arch: c_uint = 0;
        // SAFETY: valid out-pointer.
        let architecture = unsafe { self.f.nvmlDeviceGetArchitecture(gpu.handle, &mut arch) }
            .ok()
            .then(|| architecture_name(arch))
            .flatten()
            .map(str::to_string);
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let compute_capability = unsafe {
            self.f
                .nvmlDeviceGetCudaComputeCapability(gpu.handle, &mut major, &mut minor)
        }
        .ok()
        .then_some((major, minor));
        let mut pci = crate::nvml::nvmlPciInfo_t::default();
        // SAFETY: valid out-pointer.
        let pci = unsafe { self.f.nvmlDeviceGetPciInfo_v3(gpu.handle, &mut pci) }
            .ok()
            .then_some((pci.domain, pci.bus, pci.device));
        Details {
            product_name,
            architecture,
            compute_capability,
            pci,
        }
    }

    /// Whether the GPU `uuid` answers: `Ok(())`, or the failing call's error ([`NvmlError::status`] is
    /// `ERROR_GPU_IS_LOST` when it fell off the bus).
    pub fn probe(&self, uuid: &str) -> Result<(), NvmlError> {
        let c = CString::new(uuid).map_err(|_| NvmlError::BadUuid(uuid.to_string()))?;
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a valid out-pointer.
        let r = unsafe { self.f.nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut h) };
        self.check("nvmlDeviceGetHandleByUUID", r)?;
        let mut m = nvmlMemory_t::default();
        // SAFETY: valid out-pointer.
        let r = unsafe { self.f.nvmlDeviceGetMemoryInfo(h, &mut m) };
        self.check("nvmlDeviceGetMemoryInfo", r)
    }

    /// An event set with the critical XID errors of the GPUs `uuids` (a GPU that cannot report them, e.g.
    /// NOT_SUPPORTED, is left out: [`XidEvents::unwatched`]).
    pub fn xid_events(&self, uuids: &[String]) -> Result<XidEvents<'_>, NvmlError> {
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("nvmlEventSetCreate", unsafe {
            self.f.nvmlEventSetCreate(&mut set)
        })?;
        let mut events = XidEvents {
            nvml: self,
            set,
            unwatched: Vec::new(),
        };
        for uuid in uuids {
            let Ok(c) = CString::new(uuid.as_str()) else {
                continue;
            };
            let mut h: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and a valid out-pointer; `set` is live.
            let ok = unsafe { self.f.nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut h) }.ok()
                && unsafe {
                    self.f
                        .nvmlDeviceRegisterEvents(h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, set)
                }
                .ok();
            if !ok {
                events.unwatched.push(uuid.clone());
            }
        }
        Ok(events)
    }

    /// `nvmlSystemGetDriverVersion`: `580.82.07`; `None` where this NVML cannot say.
    pub fn driver_version(&self) -> Option<String> {
        let mut buf = [0 as c_char; 80]; // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
                                         // SAFETY: buf holds 80 bytes.
        unsafe { self.f.nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80) }
            .ok()
            .then(|| c_string(&buf))
            .flatten()
    }
}

/// An NVML event set of critical XID errors ([`Nvml::xid_events`]); freed on drop.
#[derive(Debug)]
pub struct XidEvents<'a> {
    nvml: &'a Nvml,
    set: nvmlEventSet_t,
    unwatched: Vec<String>,
}

impl XidEvents<'_> {
    /// The GPUs asked for whose XID errors this set cannot report.
    pub fn unwatched(&self) -> &[String] {
        &self.unwatched
    }

    /// Waits up to `timeout_ms` for an XID error: `Some((GPU UUID, XID))`, or `None` when none came.
    pub fn wait(&self, timeout_ms: u32) -> Result<Option<(String, u64)>, NvmlError> {
        // SAFETY: an all-zero nvmlEventData_t is valid (a NULL handle and zero integers).
        let mut d: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is live, `d` a valid out-pointer.
        let r = unsafe { self.nvml.f.nvmlEventSetWait_v2(self.set, &mut d, timeout_ms) };
        if r == nvmlReturn_t::ERROR_TIMEOUT {
            return Ok(None);
        }
        self.nvml.check("nvmlEventSetWait_v2", r)?;
        if d.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
            return Ok(None);
        }
        let mut buf = [0 as c_char; UUID_BUF];
        // SAFETY: buf holds UUID_BUF bytes; the handle is NVML's.
        self.nvml.check("nvmlDeviceGetUUID", unsafe {
            self.nvml
                .f
                .nvmlDeviceGetUUID(d.device, buf.as_mut_ptr(), UUID_BUF as c_uint)
        })?;
        Ok(c_string(&buf).map(|u| (u, d.eventData)))
    }
}

impl Drop for XidEvents<'_> {
    fn drop(&mut self) {
        // SAFETY: the set nvmlEventSetCreate made, freed once.
        unsafe {
            self.nvml.f.nvmlEventSetFree(self.set);
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balanced with the nvmlInit_v2 in load.
        unsafe {
            self.f.nvmlShutdown();
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
