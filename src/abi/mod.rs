//! The only `extern "C"` items of the library: one export per hooked symbol, generated from the lists in
//! `driver::{cuda,nvml}` so that the export, its real counterpart and its hook cannot drift apart.
//!
//! Every export is one line: [`cuda_guard`] / [`nvml_guard`] catch panics (→ `CUDA_ERROR_UNKNOWN` /
//! `NVML_ERROR_UNKNOWN`), get the process state (initialising it on first use) and call either the hook of the
//! same name in `crate::hooks` (active) or the real function (disabled: pure pass-through). A configuration
//! error makes every CUDA export return `CUDA_ERROR_NOT_INITIALIZED` and every NVML export an NVML error.
//!
//! Exports carry `#[cfg_attr(not(test), no_mangle)]` so the unit-test binary does not interpose itself.

pub mod cuda;
pub mod dlsym;
pub mod nvml;

use crate::ffi::cuda::CUresult;
use crate::ffi::nvml::nvmlReturn_t;
use crate::state::{self, Entry};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs one CUDA export: never unwinds, never returns without a code.
#[inline]
pub fn cuda_guard(f: impl FnOnce(Entry<crate::driver::cuda::CudaTable>) -> CUresult) -> CUresult {
    match catch_unwind(AssertUnwindSafe(|| {
        match state::cuda_entry(cuda::export_address) {
            Ok(entry) => f(entry),
            Err(code) => code,
        }
    })) {
        Ok(code) => code,
        Err(_) => CUresult::ERROR_UNKNOWN,
    }
}

/// Runs one NVML export: never unwinds, never returns without a code.
#[inline]
pub fn nvml_guard(f: impl FnOnce(Entry<crate::driver::nvml::NvmlTable>) -> nvmlReturn_t) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(|| {
        match state::nvml_entry(cuda::export_address) {
            Ok(entry) => f(entry),
            Err(code) => code,
        }
    })) {
        Ok(code) => code,
        Err(_) => nvmlReturn_t::ERROR_UNKNOWN,
    }
}

/// Generates, from a driver list, the exports plus `export_address(name)` (the address of our export of that
/// name, used by `dlsym` and the `cuGetProcAddress` reverse map) and `EXPORT_NAMES`.
macro_rules! exports {
    ($guard:ident, $ret:ty, $hooks:path,
        [ $( $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )* ]) => {
        $(
            #[doc = concat!("Export of `", stringify!($name), "` (see `crate::hooks`).")]
            #[doc = ""]
            #[doc = "# Safety"]
            #[doc = "Called by C code under the CUDA/NVML contract of the function of the same name."]
            #[cfg_attr(not(test), no_mangle)]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($( $arg: $ty ),*) -> $ret {
                $crate::abi::$guard(|e| match e {
                    // SAFETY: the caller's contract is the hook's contract.
                    $crate::state::Entry::Active(s) => unsafe { { use $hooks as h; h::$name(s, $($arg),*) } },
                    // SAFETY: forwarded unchanged under the caller's contract.
                    $crate::state::Entry::PassThrough(t) => unsafe { t.$name($($arg),*) },
                })
            }
        )*

        /// Names of every export in this table.
        pub const EXPORT_NAMES: &[&str] = &[ $( stringify!($name) ),* ];

        /// The address of our export named `name`, if we export one. No allocation, no lock: safe inside `dlsym`.
        pub fn export_address(name: &[u8]) -> Option<usize> {
            $(
                if name == stringify!($name).as_bytes() {
                    return Some($name as *const () as usize);
                }
            )*
            None
        }
    };
}
pub(crate) use exports;
