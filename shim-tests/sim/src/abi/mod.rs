//! The exported C ABI: every `#[no_mangle] extern "C"` function of libcuda.so.1 and libnvidia-ml.so.1.
//!
//! Each export is declared through `cuda_fn!` / `nvml_fn!`, which log the call (CUDASIM_LOG=1), catch any
//! panic (→ CUDA_ERROR_UNKNOWN / NVML_ERROR_UNKNOWN: unwinding into C would abort the program) and turn the
//! body's `Result` into a return code. Bodies convert arguments (NULL out-pointers → INVALID_VALUE, never a
//! dereference) and call into the simulator's modules. `stubs.rs` (generated) fills in every other public
//! driver function of cuda.h with CUDA_ERROR_NOT_SUPPORTED.
//!
//! Safety contract of every export: the caller is a C program honouring the CUDA / NVML API — non-NULL
//! pointers point to what the API says. NULL is checked for explicitly.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use crate::types::*;

mod context;
mod device;
mod exec;
mod graph;
mod init;
mod memory;
mod misc;
mod nvml;
mod stream;

/// Everything exported, for the proc-address table.
pub(crate) mod exports {
    pub(crate) use super::context::*;
    pub(crate) use super::device::*;
    pub(crate) use super::exec::*;
    pub(crate) use super::graph::*;
    pub(crate) use super::init::*;
    pub(crate) use super::memory::*;
    pub(crate) use super::misc::*;
    pub(crate) use super::stream::*;
    pub(crate) use crate::stubs::*;
}

fn log_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("CUDASIM_LOG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Prints a CUDASIM_LOG line.
pub(crate) fn log(msg: impl FnOnce() -> String) {
    if log_enabled() {
        eprintln!("cudasim: {}", msg());
    }
}

/// Runs a driver API body: logs, catches panics, maps the result.
pub(crate) fn guard_cuda(name: &str, f: impl FnOnce() -> CuResult<()>) -> CUresult {
    if let Some(e) = crate::fault::cuda(name) {
        log(|| format!("{name} -> {e} (injected: CUDASIM_FAULT)"));
        return e;
    }
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("cudasim: panic in {name}");
            CUDA_ERROR_UNKNOWN
        }
    };
    if log_enabled() {
        eprintln!("cudasim: {name} -> {r}");
    }
    r
}

/// Runs an NVML body: logs, catches panics, maps the result.
pub(crate) fn guard_nvml(name: &str, f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    if let Some(e) = crate::fault::nvml(name) {
        log(|| format!("{name} -> {e} (injected: CUDASIM_FAULT)"));
        return e;
    }
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("cudasim: panic in {name}");
            NVML_ERROR_UNKNOWN
        }
    };
    if log_enabled() {
        eprintln!("cudasim: {name} -> {r}");
    }
    r
}

/// What a known-but-unimplemented driver function returns.
pub(crate) fn stub(name: &str) -> CUresult {
    if let Some(e) = crate::fault::cuda(name) {
        return e;
    }
    let r = if crate::sim::cuda_initialised() {
        CUDA_ERROR_NOT_SUPPORTED
    } else {
        CUDA_ERROR_NOT_INITIALIZED
    };
    if log_enabled() {
        eprintln!("cudasim: {name} (not implemented) -> {r}");
    }
    r
}

/// Declares driver API exports: `fn name(args) { body returning CuResult<()> }`.
macro_rules! cuda_fn {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {$(
        $(#[$m])*
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc, unused_variables)]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::types::CUresult {
            $crate::abi::guard_cuda(stringify!($name), move || -> $crate::types::CuResult<()> {
                #[allow(unused_unsafe)]
                // SAFETY: the arguments come from a C caller honouring the CUDA API (see the abi module
                // docs); every pointer is NULL-checked by the helpers before use.
                unsafe { $body }
            })
        }
    )*};
}
pub(crate) use cuda_fn;

/// Declares NVML exports: `fn name(args) { body returning Result<(), NvmlReturn> }`.
macro_rules! nvml_fn {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {$(
        $(#[$m])*
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc, unused_variables)]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::types::NvmlReturn {
            $crate::abi::guard_nvml(stringify!($name), move || -> Result<(), $crate::types::NvmlReturn> {
                #[allow(unused_unsafe)]
                // SAFETY: the arguments come from a C caller honouring the NVML API (see the abi module
                // docs); every pointer is NULL-checked by the helpers before use.
                unsafe { $body }
            })
        }
    )*};
}
pub(crate) use nvml_fn;

/// Declares the generated stubs (see stubs.rs).
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub(crate) unsafe extern "C" fn $name() -> $crate::types::CUresult {
            $crate::abi::stub(stringify!($name))
        }
    )*};
}
pub(crate) use not_supported;

/// Same body under two (or more) exported names, e.g. a function and its `_ptsz` twin: the extra names
/// forward to the first. Each forwarder logs its own name, which also keeps it a function of its own: a real
/// driver's entry points have distinct addresses, and an optimising build would otherwise fold a forwarder
/// into its target (interposers map entry points by address).
macro_rules! alias {
    ($($alias:ident => $target:ident ( $($arg:ident : $ty:ty),* $(,)? );)*) => {$(
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub(crate) unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::types::CUresult {
            $crate::abi::log(|| concat!(stringify!($alias), " => ", stringify!($target)).to_string());
            // SAFETY: same contract as the target: the arguments are passed through unchanged.
            unsafe { $target($($arg),*) }
        }
    )*};
}
pub(crate) use alias;

/// Writes `v` through an out-pointer (INVALID_VALUE when NULL).
///
/// # Safety
/// A non-NULL `p` must be valid for a write of `T` (the C API's contract).
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> CuResult<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and valid per the function contract; unaligned-tolerant.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Like `out`, for NVML.
///
/// # Safety
/// As `out`.
pub(crate) unsafe fn nout<T>(p: *mut T, v: T) -> Result<(), NvmlReturn> {
    // SAFETY: forwarded contract.
    unsafe { out(p, v) }.map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// Reads a struct the caller passed (INVALID_VALUE when NULL).
///
/// # Safety
/// A non-NULL `p` must be valid for a read of `T`.
pub(crate) unsafe fn read<T: Copy>(p: *const T) -> CuResult<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and valid per the function contract.
    Ok(unsafe { p.read_unaligned() })
}

/// A C string argument (INVALID_VALUE when NULL).
///
/// # Safety
/// A non-NULL `p` must be a NUL-terminated string.
pub(crate) unsafe fn cstr<'a>(p: *const c_char) -> CuResult<std::borrow::Cow<'a, str>> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: NUL-terminated per the contract.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

/// Copies `s` with a NUL into a caller buffer of `len` bytes (truncating).
///
/// # Safety
/// A non-NULL `buf` must be valid for `len` bytes.
pub(crate) unsafe fn write_cstr(buf: *mut c_char, len: usize, s: &str) -> CuResult<()> {
    if buf.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: n + 1 ≤ len bytes of the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// A handle argument as the simulator's number.
pub(crate) fn h(p: *mut c_void) -> u64 {
    p as u64
}

/// A simulator number as a handle.
pub(crate) fn hp(v: u64) -> *mut c_void {
    v as *mut c_void
}
