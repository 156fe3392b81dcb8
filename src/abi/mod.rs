//! The only `extern "C"` items of the library: one export per hooked symbol, generated from the routing lists
//! in `abi::{cuda,nvml}` (one line per export: its arguments and the hook it calls) with the signatures of
//! `ffi`, so that the export, its real counterpart and its hook cannot drift apart.
//!
//! Every export is one line: [`cuda_guard`] / [`nvml_guard`] catch panics (→ `CUDA_ERROR_UNKNOWN` /
//! `NVML_ERROR_UNKNOWN`), get the process state (initialising it on first use) and call either the hook its
//! line names (active) or the real function (disabled: pure pass-through). A launch line first asks
//! [`launch_unhooked`] (loads only): while no limit applies to launches it jumps to the real function. A configuration
//! error makes every CUDA export return `CUDA_ERROR_NOT_INITIALIZED` and every NVML export an NVML error.
//!
//! Exports carry `#[cfg_attr(not(test), no_mangle)]` so the unit-test binary does not interpose itself.

pub(crate) mod cuda;
pub(crate) mod dlsym;
pub(crate) mod nvml;

use crate::ffi::cuda::CUresult;
use crate::ffi::nvml::nvmlReturn_t;
use crate::state::{self, Entry};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs one export: how the process proceeds (`entry`, which initialises it on first use), then `f`; never
/// unwinds (a panic is `unknown`), never returns without a code.
#[inline]
fn guard<T: 'static, R>(
    entry: fn(state::Exports) -> Result<Entry<T>, R>,
    unknown: R,
    f: impl FnOnce(Entry<T>) -> R,
) -> R {
    catch_unwind(AssertUnwindSafe(|| {
        entry(cuda::export_address).map_or_else(|code| code, f)
    }))
    .unwrap_or(unknown)
}

/// Runs one CUDA export (see [`guard`]).
#[inline]
pub(crate) fn cuda_guard(f: impl FnOnce(Entry<crate::driver::cuda::CudaTable>) -> CUresult) -> CUresult {
    guard(state::cuda_entry, CUresult::ERROR_UNKNOWN, f)
}

/// Runs one NVML export (see [`guard`]).
#[inline]
pub(crate) fn nvml_guard(
    f: impl FnOnce(Entry<crate::driver::nvml::NvmlTable>) -> nvmlReturn_t,
) -> nvmlReturn_t {
    guard(state::nvml_entry, nvmlReturn_t::ERROR_UNKNOWN, f)
}

/// The active state when a launch needs no hook now ([`crate::devices::Devices::launch_unhooked`]): no limit
/// applies to launches and no limits file changed since it was last read. `None`: take the hook.
#[inline(always)]
pub(crate) fn launch_unhooked() -> Option<&'static state::Shim> {
    state::active_cuda().filter(|s| s.devices.launch_unhooked())
}

/// One export of [`exports!`]: the guard around its `body`, or with a pass-through check (`[pass]`), the
/// check first and the guarded body out of line, so that the forwarded call pays neither the guard's frame nor
/// its spilled arguments (the forward and the hooked path are both tail calls).
macro_rules! export {
    ([] $guard:ident, $ret:ty, $table:ident, $name:ident ($( $arg:ident: $ty:ty ),*)) => {
        $crate::abi::export!(@doc $name
        pub(crate) unsafe extern "C" fn $name($( $arg: $ty ),*) -> $ret {
            $crate::abi::export!(@guard $guard, $name ($($arg),*))
        });
    };
    ([$pass:ident] $guard:ident, $ret:ty, $table:ident, $name:ident ($( $arg:ident: $ty:ty ),*)) => {
        $crate::abi::export!(@doc $name
        pub(crate) unsafe extern "C" fn $name($( $arg: $ty ),*) -> $ret {
            #[inline(never)]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            unsafe extern "C" fn hooked($( $arg: $ty ),*) -> $ret {
                $crate::abi::export!(@guard $guard, $name ($($arg),*))
            }
            // One call through a pointer either way, so that both are tail calls reusing the caller's arguments.
            let f = match $crate::abi::$pass() {
                Some(s) => $table(s).$name.unwrap_or(hooked),
                None => hooked,
            };
            // SAFETY: the real function (forwarded unchanged) or the guarded hook, under the caller's contract.
            unsafe { f($($arg),*) }
        });
    };
    (@doc $name:ident $f:item) => {
        #[doc = concat!("Export of `", stringify!($name), "` (see `body`).")]
        #[doc = ""]
        #[doc = "# Safety"]
        #[doc = "Called by C code under the CUDA/NVML contract of the function of the same name."]
        #[cfg_attr(not(test), no_mangle)]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        $f
    };
    (@guard $guard:ident, $name:ident ($( $arg:ident ),*)) => {
        $crate::abi::$guard(|e| match e {
            // SAFETY: the caller's contract.
            $crate::state::Entry::Active(s) => unsafe { body::$name(s, $($arg),*) },
            // SAFETY: forwarded unchanged under the caller's contract.
            $crate::state::Entry::PassThrough(t) => unsafe { t.$name($($arg),*) },
        })
    };
}
pub(crate) use export;

/// The routing list of one library: `exports! { guard, Ret, lib, table, (call, real) <lines> }`, one line per
/// exported function, `name (arg names) => module::hook(exprs);`, or `name (args) => [pass] module::hook(exprs);`
/// where `abi::pass` (atomic loads only: it runs before the panic guard) says the hook would only forward the
/// call, which then goes to the real function without the guard's frame. The argument types are `ffi::<lib>`'s (the
/// declaration checked against NVIDIA's headers: `ffi::<lib>::params::<name>`, and a compile-time check that the
/// names are the declaration's, in its order). The hook is `crate::hooks::<module>::<hook>(shim, exprs…)`: the
/// expressions may use the arguments, `call` (the real function with the caller's arguments) and `real` (the real
/// function, taking arguments). So the `_v2`, `_v3`, `_ptsz` and legacy forms of a call are lines naming the same
/// hook: exporting an entry point of a new CUDA version is its line in `ffi` and a line here.
///
/// Generates for each line its dispatch `body::<name>(shim, args…)` (binds `call` / `real` to the real function
/// and calls the hook), the export (guard, then the body or, disabled, the real function), plus
/// `export_address(name)` (the address of our export of that name, used by `dlsym` and the `cuGetProcAddress`
/// reverse map).
macro_rules! exports {
    ($guard:ident, $ret:ty, $lib:ident, $table:ident, ($call:ident, $real:ident)
        $( $name:ident ( $( $arg:ident ),* $(,)? ) => $( [$pass:ident] )? $hm:ident :: $hf:ident ( $($e:expr),* $(,)? ) ; )*) => {
        /// What each export does in an active process, as plain Rust (unit tests call these).
        #[allow(non_snake_case, unused_variables, unused_unsafe, clippy::too_many_arguments)]
        pub(crate) mod body {
            use super::*;
            use $crate::state::Shim;
            $(
                #[doc = concat!("`", stringify!($name), "`: the real call bound as `call` / `real`, then the hook.")]
                #[doc = ""]
                #[doc = "# Safety"]
                #[doc = "The C function's contract."]
                #[inline]
                pub(crate) unsafe fn $name(s: &Shim, $( $arg: $crate::ffi::$lib::params::$name::$arg ),*) -> $ret {
                    let t = super::$table(s);
                    // SAFETY: the real function with the caller's arguments, under the caller's contract.
                    let $call = move || unsafe { t.$name($($arg),*) };
                    // SAFETY: the real function with arguments the hook supplies under the same contract.
                    let $real = move |$($arg: $crate::ffi::$lib::params::$name::$arg),*| unsafe { t.$name($($arg),*) };
                    // SAFETY: the caller's contract is the hook's.
                    unsafe { $crate::hooks::$hm::$hf(s, $($e),*) }
                }
            )*
        }

        $(
            const _: () = assert!(
                $crate::ffi::same_str(stringify!($($arg),*), $crate::ffi::$lib::params::$name::NAMES),
                concat!(stringify!($name), ": the arguments are not ffi's, in ffi's order"),
            );

            $crate::abi::export! { [$($pass)?] $guard, $ret, $table, $name ($( $arg: $crate::ffi::$lib::params::$name::$arg ),*) }
        )*

        /// Names of every export in this table.

        /// The address of our export named `name`, if we export one. No allocation, no lock: safe inside `dlsym`.
        pub(crate) fn export_address(name: &[u8]) -> Option<usize> {
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
