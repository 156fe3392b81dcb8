//! Initialisation, versions, error strings, cuGetProcAddress and cuGetExportTable.

use std::ffi::{c_char, c_void};

use super::{cstr, cuda_fn, out, read};
use crate::errors;
use crate::proc_address::{lookup, table, LookupError};
use crate::types::*;

/// The driver version in force (the state file creator's, or the environment's before any state exists).
fn driver_version() -> u32 {
    crate::sim::driver_version()
}

unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut u32,
) -> CuResult<()> {
    // SAFETY: forwarded contract of cuGetProcAddress's arguments.
    unsafe {
        let name = cstr(symbol)?;
        if pfn.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let set_status = |s: u32| {
            if !status.is_null() {
                *status = s;
            }
        };
        *pfn = std::ptr::null_mut();
        let driver = driver_version();
        if version < 0 || version as u32 > driver {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        match lookup(table(), &name, version as u32, per_thread, driver) {
            Ok(e) => {
                super::log(|| format!("cuGetProcAddress({name}, {version}, {flags}) = {}", e.symbol));
                *pfn = e.addr as *mut c_void;
                set_status(CU_GET_PROC_ADDRESS_SUCCESS);
                Ok(())
            }
            Err(LookupError::NotFound) => {
                set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
                Err(CUDA_ERROR_NOT_FOUND)
            }
            Err(LookupError::VersionNotSufficient) => {
                set_status(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }
}

cuda_fn! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::sim::cuda_init()
    }

    fn cuDriverGetVersion(version: *mut i32) {
        // Works before cuInit, as on a real driver.
        out(version, driver_version() as i32)
    }

    fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) {
        match errors::cuda_error_name(error) {
            Some(n) => out(pstr, errors::c_static(n)),
            None => {
                let _ = out(pstr, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) {
        match errors::cuda_error_string(error) {
            Some(n) => out(pstr, errors::c_static(n)),
            None => {
                let _ = out(pstr, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: i32, flags: u64) {
        get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: i32,
        flags: u64,
        symbol_status: *mut u32,
    ) {
        get_proc_address(symbol, pfn, cuda_version, flags, symbol_status)
    }

    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        let uuid = read(id)?;
        if table.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match crate::export_table::get(&uuid.bytes) {
            Some(t) => out(table, t),
            None => {
                out(table, std::ptr::null())?;
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }
}
