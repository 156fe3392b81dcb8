//! Our `dlsym`, `dlvsym`, `dlopen` and `dlmopen`: every lookup by name the dynamic loader offers ends in our
//! exports (#11 class 3, docs/interception.md "Reaching the hooks").
//!
//! `dlsym(handle, name)` / `dlvsym(handle, name, version)` for a name we export (CUDA, NVML, and these four
//! themselves): call glibc's; if it found something, return our export instead (so not-found stays
//! not-found). Every other name goes to glibc's by a *tail jump*, with the caller's return address untouched:
//! `dlsym(RTLD_NEXT, …)` is resolved relative to the object that called it, exactly as without us. (A plain
//! Rust wrapper would make every RTLD_NEXT lookup relative to libcuquota, which sends interposers loaded after
//! us back into themselves.) `dlopen` and `dlmopen(LM_ID_BASE, …)` tail-jump with `RTLD_DEEPBIND` cleared: a
//! library's own scope first would bind its CUDA references to libcuda, past the preload. `dlmopen` into any
//! other namespace is refused: that namespace would get its own libcuda and libc, without the preload.
//!
//! Safe before anything is initialised: the routers take no lock, allocate nothing and never touch the
//! process state; glibc's functions are read from libc's symbol table (`driver::dl`).

use crate::driver::dl::{self, real_dlsym, real_dlvsym};
use std::ffi::{c_char, c_int, c_long, c_void, CStr};

/// True when `name` is a symbol we export (CUDA, NVML or the loader's lookups).
pub(crate) fn is_hooked(name: &[u8]) -> bool {
    our_address(name).is_some()
}

/// Address of our export for `name`, if any. Cheap prefix filter first: this runs on every `dlsym` in the process.
pub(crate) fn our_address(name: &[u8]) -> Option<usize> {
    match name {
        [b'c', b'u', ..] => crate::abi::cuda::export_address(name),
        [b'n', b'v', b'm', b'l', ..] => crate::abi::nvml::export_address(name),
        [b'd', b'l', ..] => dl_export_address(name),
        _ => None,
    }
}

/// Our exports of the loader's lookups (none in the unit-test binary, which exports nothing).
fn dl_export_address(name: &[u8]) -> Option<usize> {
    #[cfg(not(test))]
    {
        let f: usize = match name {
            b"dlsym" => dlsym as *const () as usize,
            b"dlvsym" => dlvsym as *const () as usize,
            b"dlopen" => dlopen as *const () as usize,
            b"dlmopen" => dlmopen as *const () as usize,
            _ => return None,
        };
        Some(f)
    }
    #[cfg(test)]
    {
        let _ = name;
        None
    }
}

/// True when `name` is non-NULL and one we export.
fn hooked_name(name: *const c_char) -> bool {
    // SAFETY: the lookup functions require a NUL-terminated name; NULL is excluded.
    !name.is_null() && is_hooked(unsafe { CStr::from_ptr(name) }.to_bytes())
}

/// Picks where the `dlsym` trampoline jumps: our redirecting lookup for hooked names, glibc's `dlsym` otherwise.
/// Returns an address with the `dlsym` signature.
extern "C" fn dlsym_route(_handle: *mut c_void, name: *const c_char) -> usize {
    if hooked_name(name) {
        return dlsym_redirect as *const () as usize;
    }
    dl::DLSYM.get().unwrap_or(dl_unavailable as *const () as usize)
}

/// Picks where the `dlvsym` trampoline jumps: our redirecting lookup for hooked names, glibc's `dlvsym` else.
extern "C" fn dlvsym_route(_handle: *mut c_void, name: *const c_char) -> usize {
    if hooked_name(name) {
        return dlvsym_redirect as *const () as usize;
    }
    dl::DLVSYM.get().unwrap_or(dl_unavailable as *const () as usize)
}

/// Where the `dlopen` trampoline jumps (after clearing `RTLD_DEEPBIND`): glibc's `dlopen`.
extern "C" fn dlopen_route() -> usize {
    dl::DLOPEN.get().unwrap_or(dl_unavailable as *const () as usize)
}

/// Where the `dlmopen` trampoline jumps (after clearing `RTLD_DEEPBIND`): glibc's `dlmopen` for the base
/// namespace, the refusal for any other.
extern "C" fn dlmopen_route(lmid: c_long) -> usize {
    if lmid != libc::LM_ID_BASE {
        return dlmopen_refused as *const () as usize;
    }
    dl::DLMOPEN.get().unwrap_or(dl_unavailable as *const () as usize)
}

/// The message `dlerror` gives for a refused `dlmopen` (as the name of a file that cannot exist).
const DLMOPEN_REFUSED: &CStr = c"/cuquota: dlmopen into a new link-map namespace is refused (its own libcuda would run without the limits); load the library with dlopen";

/// `dlmopen` into another namespace: NULL, with `dlerror` saying why. glibc sets `dlerror` only from its own
/// failures, so we make one: a `dlopen` of an absolute path named after the reason, which does not exist.
unsafe extern "C" fn dlmopen_refused(_lmid: c_long, _file: *const c_char, _mode: c_int) -> *mut c_void {
    if let Some(open) = dl::real_dlopen() {
        // SAFETY: a NUL-terminated path; the file does not exist, so nothing is loaded.
        let h = unsafe { open(DLMOPEN_REFUSED.as_ptr(), libc::RTLD_LAZY) };
        if !h.is_null() {
            // Someone created it: do not hand out whatever that is.
            // SAFETY: a handle just returned by dlopen.
            unsafe { libc::dlclose(h) };
        }
    }
    std::ptr::null_mut()
}

/// `dlvsym` for names we hook: real result, swapped for our export when found.
unsafe extern "C" fn dlvsym_redirect(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let Some(real) = real_dlvsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments to glibc's dlvsym.
    let p = unsafe { real(handle, name, version) };
    if p.is_null() {
        return p;
    }
    // SAFETY: `name` is non-NULL here (the router checked) and NUL-terminated.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    our_address(bytes).map_or(p, |ours| ours as *mut c_void)
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

/// Used only if glibc's functions could not be found at all (not glibc?): behave as "not found" / "cannot
/// load" (every argument ignored, whatever the signature).
unsafe extern "C" fn dl_unavailable() -> *mut c_void {
    std::ptr::null_mut()
}

// Our exports have glibc's signatures (`ffi::dlfcn`, checked against dlfcn.h).
#[cfg(not(test))]
const _: (dl::DlsymFn, dl::DlvsymFn, dl::DlopenFn, dl::DlmopenFn) = (dlsym, dlvsym, dlopen, dlmopen);

// The trampolines clear this bit with a literal.
const _: () = assert!(libc::RTLD_DEEPBIND == 8);

/// The exported `dlsym` (x86-64): save the arguments, ask [`dlsym_route`] for the target, restore, tail-jump.
///
/// # Safety
/// Called by C code under `dlsym`'s contract.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
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

/// The exported `dlvsym` (x86-64): as `dlsym`, with the version (rdx) saved too.
///
/// # Safety
/// Called by C code under `dlvsym`'s contract.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlvsym_route,
    )
}

/// The exported `dlopen` (x86-64): `RTLD_DEEPBIND` cleared from the mode (esi), then glibc's `dlopen` by a tail
/// jump (it searches the caller's RUNPATH, found from the return address).
///
/// # Safety
/// Called by C code under `dlopen`'s contract.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "and esi, -9",
        "jmp rax",
        route = sym dlopen_route,
    )
}

/// The exported `dlmopen` (x86-64): [`dlmopen_route`] picks glibc's (base namespace) or the refusal;
/// `RTLD_DEEPBIND` cleared from the mode (edx).
///
/// # Safety
/// Called by C code under `dlmopen`'s contract.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "and edx, -9",
        "jmp rax",
        route = sym dlmopen_route,
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

/// The exported `dlvsym` (aarch64).
///
/// # Safety
/// Called by C code under `dlvsym`'s contract.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        route = sym dlvsym_route,
    )
}

/// The exported `dlopen` (aarch64): `RTLD_DEEPBIND` cleared from w1.
///
/// # Safety
/// Called by C code under `dlopen`'s contract.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "and w1, w1, #0xfffffff7",
        "br x16",
        route = sym dlopen_route,
    )
}

/// The exported `dlmopen` (aarch64): `RTLD_DEEPBIND` cleared from w2.
///
/// # Safety
/// Called by C code under `dlmopen`'s contract.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "and w2, w2, #0xfffffff7",
        "br x16",
        route = sym dlmopen_route,
    )
}

/// Elsewhere: plain calls (RTLD_NEXT then resolves relative to this library, and dlopen searches our RUNPATH).
#[cfg(all(not(test), not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
mod plain {
    use super::*;

    /// # Safety
    /// Called by C code under `dlsym`'s contract.
    #[no_mangle]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        // SAFETY: the router returns an address with the dlsym signature.
        let f: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
            unsafe { std::mem::transmute(dlsym_route(handle, name)) };
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(handle, name) }
    }

    /// # Safety
    /// Called by C code under `dlvsym`'s contract.
    #[no_mangle]
    pub unsafe extern "C" fn dlvsym(
        handle: *mut c_void,
        name: *const c_char,
        version: *const c_char,
    ) -> *mut c_void {
        // SAFETY: the router returns an address with the dlvsym signature.
        let f: dl::DlvsymFn = unsafe { std::mem::transmute(dlvsym_route(handle, name)) };
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(handle, name, version) }
    }

    /// # Safety
    /// Called by C code under `dlopen`'s contract.
    #[no_mangle]
    pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
        // SAFETY: the router returns an address with the dlopen signature.
        let f: dl::DlopenFn = unsafe { std::mem::transmute(dlopen_route()) };
        // SAFETY: forwarding the caller's arguments, RTLD_DEEPBIND cleared.
        unsafe { f(file, mode & !libc::RTLD_DEEPBIND) }
    }

    /// # Safety
    /// Called by C code under `dlmopen`'s contract.
    #[no_mangle]
    pub unsafe extern "C" fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void {
        // SAFETY: the router returns an address with the dlmopen signature.
        let f: dl::DlmopenFn = unsafe { std::mem::transmute(dlmopen_route(lmid)) };
        // SAFETY: forwarding the caller's arguments, RTLD_DEEPBIND cleared.
        unsafe { f(lmid, file, mode & !libc::RTLD_DEEPBIND) }
    }
}
#[cfg(all(not(test), not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
use plain::{dlmopen, dlopen, dlsym, dlvsym};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooked_names_are_recognised() {
        assert!(is_hooked(b"cuMemAlloc_v2"));
        assert!(is_hooked(b"cuMemAlloc"));
        assert!(is_hooked(b"cuGetProcAddress_v2"));
        assert!(is_hooked(b"nvmlDeviceGetMemoryInfo_v2"));
        assert!(is_hooked(b"cuMemcpyAsync_ptsz"));
        assert!(!is_hooked(b"cuMemcpy3DBatchAsync_v3"));
        assert!(!is_hooked(b"cuCtxGetFlags"));
        assert!(!is_hooked(b"cuGetExportTable"));
        assert!(!is_hooked(b"malloc"));
        assert!(!is_hooked(b"dlclose"));
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
    fn dlvsym_dlopen_and_dlmopen_routes() {
        let real = real_dlvsym().expect("glibc dlvsym") as usize;
        assert_eq!(dlvsym_route(std::ptr::null_mut(), c"malloc".as_ptr()), real);
        assert_eq!(
            dlvsym_route(std::ptr::null_mut(), c"cuMemAlloc_v2".as_ptr()),
            dlvsym_redirect as *const () as usize
        );
        assert_eq!(Some(dlopen_route()), dl::DLOPEN.get());
        assert_eq!(Some(dlmopen_route(libc::LM_ID_BASE)), dl::DLMOPEN.get());
        assert_eq!(dlmopen_route(-1), dlmopen_refused as *const () as usize);
        assert_eq!(dlmopen_route(1), dlmopen_refused as *const () as usize);
    }

    #[test]
    fn a_refused_dlmopen_says_why_in_dlerror() {
        // SAFETY: the refusal ignores its arguments; dlerror returns NULL or a NUL-terminated string.
        let (h, e) = unsafe {
            let h = dlmopen_refused(-1, c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
            (h, libc::dlerror())
        };
        assert!(h.is_null());
        assert!(!e.is_null(), "dlerror empty after a refused dlmopen");
        // SAFETY: non-NULL dlerror string.
        let msg = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
        assert!(
            msg.starts_with("/cuquota: dlmopen into a new link-map namespace is refused"),
            "{msg}"
        );
    }

    #[test]
    fn redirect_keeps_not_found() {
        // SAFETY: RTLD_DEFAULT lookup of a name nothing in the test binary defines.
        let p = unsafe { dlsym_redirect(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
        assert!(p.is_null());
    }
}
