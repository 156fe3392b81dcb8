//! glibc's `dlsym`, `dlvsym`, `dlopen` and `dlmopen`, which the preload library both calls (glibc's own, read
//! from libc's symbol table) and exports: checked against `dlfcn.h` by `header_check`.

use std::ffi::{c_char, c_int, c_long, c_void};

/// `dlsym(handle, name)`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `dlvsym(handle, name, version)`.
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;
/// `dlopen(file, mode)`.
pub type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
/// `dlmopen(lmid, file, mode)`.
pub type DlmopenFn = unsafe extern "C" fn(c_long, *const c_char, c_int) -> *mut c_void;

/// The four types above, arguments as Rust spells them, for `header_check` (each returns `void *`).
pub const SIGNATURES: &[(&str, &[&str])] = &[
    ("dlsym", &["*mut c_void", "*const c_char"]),
    ("dlvsym", &["*mut c_void", "*const c_char", "*const c_char"]),
    ("dlopen", &["*const c_char", "c_int"]),
    ("dlmopen", &["c_long", "*const c_char", "c_int"]),
];
