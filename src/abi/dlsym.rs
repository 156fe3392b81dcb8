//! Our `dlsym`: the way programs that `dlopen("libcuda.so.1")` (the CUDA runtime does) still reach our hooks.
//!
//! `dlsym(handle, name)` for a name we export: call the real `dlsym`; if it found something, return our export
//! instead (so not-found stays not-found). Every other name goes to glibc's `dlsym` by a *tail jump*, with the
//! caller's return address untouched: `dlsym(RTLD_NEXT, …)` is resolved relative to the object that called it,
//! exactly as without us. (A plain Rust wrapper would make every RTLD_NEXT lookup relative to libcuquota, which
//! sends interposers loaded after us back into themselves.)
//!
//! Safe before anything is initialised: the router takes no lock, allocates nothing and never touches the
//! process state; the real `dlsym` is resolved with `dlvsym`, which we do not export.

use crate::driver::real_dlsym;
use std::ffi::{c_char, c_void, CStr};

/// True when `name` is a symbol we export (CUDA or NVML).
pub fn is_hooked(name: &[u8]) -> bool {
    our_address(name).is_some()
}

/// Address of our export for `name`, if any. Cheap prefix filter first: this runs on every `dlsym` in the process.
pub fn our_address(name: &[u8]) -> Option<usize> {
    match name {
        [b'c', b'u', ..] => crate::abi::cuda::export_address(name),
        [b'n', b'v', b'm', b'l', ..] => crate::abi::nvml::export_address(name),
        _ => None,
    }
}

/// Picks where the `dlsym` trampoline jumps: our redirecting lookup for hooked names, glibc's `dlsym` otherwise.
/// Returns an address with the `dlsym` signature.
extern "C" fn dlsym_route(_handle: *mut c_void, name: *const c_char) -> usize {
    if !name.is_null() {
        // SAFETY: `dlsym` requires a NUL-terminated name; NULL was excluded.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if is_hooked(bytes) {
            return dlsym_redirect as *const () as usize;
        }
    }
    match real_dlsym() {
        Some(f) => f as usize,
        None => dlsym_unavailable as *const () as usize,
    }
}

/// The lookup for names we hook: real result, swapped for our export when found.
unsafe extern "C" fn dlsym_redirect(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments to glibc's dlsym.
    let p = unsafe { real(handle, name) };
    if p.is_null() {
        return p;
    }
    // SAFETY: `name` is non-NULL here (the router checked) and NUL-terminated.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    match our_address(bytes) {
        Some(ours) => ours as *mut c_void,
        None => p,
    }
}

/// Used only if glibc's `dlsym` could not be found at all (not glibc?): behave as "not found".
unsafe extern "C" fn dlsym_unavailable(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// The exported `dlsym` (x86-64): save the arguments, ask [`dlsym_route`] for the target, restore, tail-jump.
///
/// # Safety
/// Called by C code under `dlsym`'s contract.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlsym_route,
    )
}

/// The exported `dlsym` (aarch64): as on x86-64; x30 is restored before the tail branch.
///
/// # Safety
/// Called by C code under `dlsym`'s contract.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16",
        route = sym dlsym_route,
    )
}

/// The exported `dlsym` elsewhere: a plain call (RTLD_NEXT then resolves relative to this library).
///
/// # Safety
/// Called by C code under `dlsym`'s contract.
#[cfg(all(not(test), not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let target = dlsym_route(handle, name);
    // SAFETY: the router returns an address with the dlsym signature.
    let f: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute(target) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { f(handle, name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooked_names_are_recognised() {
        assert!(is_hooked(b"cuMemAlloc_v2"));
        assert!(is_hooked(b"cuMemAlloc"));
        assert!(is_hooked(b"cuGetProcAddress_v2"));
        assert!(is_hooked(b"nvmlDeviceGetMemoryInfo_v2"));
        assert!(!is_hooked(b"cuMemcpy"));
        assert!(!is_hooked(b"cuGetExportTable"));
        assert!(!is_hooked(b"malloc"));
        assert!(!is_hooked(b""));
    }

    #[test]
    fn router_sends_unhooked_names_to_glibc() {
        let real = real_dlsym().expect("glibc dlsym") as usize;
        assert_eq!(dlsym_route(std::ptr::null_mut(), c"malloc".as_ptr()), real);
        assert_eq!(dlsym_route(std::ptr::null_mut(), std::ptr::null()), real);
        assert_eq!(
            dlsym_route(std::ptr::null_mut(), c"cuInit".as_ptr()),
            dlsym_redirect as *const () as usize
        );
    }

    #[test]
    fn redirect_keeps_not_found() {
        // SAFETY: RTLD_DEFAULT lookup of a name nothing in the test binary defines.
        let p = unsafe { dlsym_redirect(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
        assert!(p.is_null());
    }
}
