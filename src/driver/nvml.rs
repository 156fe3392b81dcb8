//! The real `libnvidia-ml.so.1`: its table of functions ([`NvmlTable`], generated in `ffi::nvml`, checked
//! against `nvml.h`), and NVML as the shim uses it ([`Nvml`]: initialised by us on first use).

use super::Library;
use crate::ffi::nvml::*;
use crate::log::{log, Level};
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU8, Ordering};

pub(crate) use crate::ffi::nvml::NvmlTable;

/// Every function of the table, resolved in `lib` (a missing one returns `NVML_ERROR_FUNCTION_NOT_FOUND` when
/// called).
pub(crate) fn load(lib: &Library) -> NvmlTable {
    // SAFETY: `Library::symbol` returns NULL or the address of that name in a library never closed.
    unsafe { NvmlTable::load(|name| lib.symbol(name)) }
}

/// NVML as the shim uses it: the real library (if it loaded) and our own `nvmlInit_v2`, done on first use.
pub(crate) struct Nvml {
    table: Option<NvmlTable>,
    /// 0 = not tried yet, 1 = initialised by us, 2 = unavailable. Racing first callers may both initialise:
    /// NVML counts `nvmlInit` calls and we never shut down, so that is harmless. An atomic rather than a
    /// `OnceLock`: a fork while another thread initialises must not leave the child waiting for ever.
    state: AtomicU8,
}

impl Nvml {
    /// Wraps the real library's table (`None`: it could not be loaded).
    pub(crate) fn new(table: Option<NvmlTable>) -> Nvml {
        Nvml {
            table,
            state: AtomicU8::new(0),
        }
    }

    /// The real functions, whether or not we initialised NVML (for forwarding the program's own calls).
    pub(crate) fn table(&self) -> Option<&NvmlTable> {
        self.table.as_ref()
    }

    /// The real functions (a table without any when the library did not load: calls then return
    /// `NVML_ERROR_LIBRARY_NOT_FOUND`).
    pub(crate) fn real(&self) -> &NvmlTable {
        static EMPTY: std::sync::OnceLock<NvmlTable> = std::sync::OnceLock::new();
        self.table
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(|| NvmlTable::empty(false)))
    }

    /// The real functions after our own `nvmlInit_v2`, if NVML is available.
    pub(crate) fn ready(&self) -> Option<&NvmlTable> {
        let t = self.table.as_ref()?;
        let ready = match self.state.load(Ordering::Acquire) {
            0 => {
                // SAFETY: plain NVML call.
                let r = unsafe { t.nvmlInit_v2() };
                let next = if r.ok() { 1 } else { 2 };
                match self
                    .state
                    .compare_exchange(0, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        if !r.ok() {
                            log!(
                                Level::Info,
                                "NVML unavailable (error {}): overhead is estimated",
                                r.0
                            );
                        }
                        next
                    }
                    Err(first) => first,
                }
            }
            s => s,
        };
        (ready == 1).then_some(t)
    }

    /// NVML's handle for the device with this UUID.
    pub(crate) fn handle_by_uuid(&self, uuid: &[u8; 16]) -> Option<nvmlDevice_t> {
        let t = self.ready()?;
        let name = std::ffi::CString::new(cuquota_core::region::layout::format_uuid(uuid)).ok()?;
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: NUL-terminated UUID string, valid out-pointer.
        let r = unsafe { t.nvmlDeviceGetHandleByUUID(name.as_ptr(), &mut handle) };
        (r.ok() && !handle.is_null()).then_some(handle)
    }

    /// The processes NVML lists on the device with this UUID (`nvmlDeviceGetComputeRunningProcesses_v3`).
    pub(crate) fn processes(&self, uuid: &[u8; 16]) -> Option<Vec<nvmlProcessInfo_v2_t>> {
        let t = self.ready()?;
        let handle = self.handle_by_uuid(uuid)?;
        // SAFETY: `list` hands a buffer with room for the count it passes.
        list(32, 1 << 16, |n, buf| unsafe {
            t.nvmlDeviceGetComputeRunningProcesses_v3(handle, n, buf)
        })
        .ok()
    }
}

/// Calls an NVML list function with a buffer grown (from `first` records, up to `max`) until the list fits:
/// `call(count in/out, buffer)`. The real function's error otherwise.
pub(crate) fn list<T: Copy + Default>(
    first: c_uint,
    max: c_uint,
    mut call: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut cap = first;
    loop {
        let mut buf = vec![T::default(); cap as usize];
        let mut n = cap;
        let r = call(&mut n, buf.as_mut_ptr());
        if r.ok() {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        if r != nvmlReturn_t::ERROR_INSUFFICIENT_SIZE || cap >= max {
            return Err(r);
        }
        cap = (n.max(cap) + 32).min(max);
    }
}
