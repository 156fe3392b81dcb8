//! The real libraries: `libcuda.so.1` and `libnvidia-ml.so.1`, loaded once and resolved into tables of typed
//! function pointers.
//!
//! Why not `libloading`: this library exports `dlsym`, so anything that calls the public `dlsym` (libloading
//! included) would come back into our own export. Every lookup here goes through [`real_dlsym`], glibc's own
//! `dlsym` read from libc's dynamic symbol table ([`dl`]: we export `dlvsym` too).
//!
//! Error codes (documented in docs/interception.md): a library that cannot be loaded makes every CUDA call
//! return `CUDA_ERROR_NOT_INITIALIZED` (NVML: `NVML_ERROR_LIBRARY_NOT_FOUND`); a symbol the loaded library
//! lacks makes that call return `CUDA_ERROR_NOT_FOUND` (NVML: `NVML_ERROR_FUNCTION_NOT_FOUND`). Never a crash.

pub(crate) mod cuda;
pub(crate) mod dl;
pub(crate) mod nvml;
pub(crate) mod proc_map;

use std::ffi::{c_void, CStr};

pub(crate) use dl::{real_dlsym, DlsymFn};

/// Why a library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LoadError {
    /// glibc's `dlsym` could not be found (not a glibc system?).
    NoRealDlsym,
    /// `dlopen` failed; the string is `dlerror()`.
    Open(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NoRealDlsym => write!(f, "glibc's dlsym not found"),
            LoadError::Open(e) => write!(f, "{e}"),
        }
    }
}

/// A `dlopen`ed library. Never closed: function pointers into it live as long as the process.
pub(crate) struct Library {
    handle: *mut c_void,
    dlsym: DlsymFn,
}

// SAFETY: a dlopen handle is a process-global token; dlsym on it is thread-safe.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Library {
    /// `dlopen(path, RTLD_LAZY | RTLD_LOCAL)`: the same flags a program's own `dlopen("libcuda.so.1")` would use,
    /// so we share its instance of the library.
    pub(crate) fn open(path: &CStr) -> Result<Library, LoadError> {
        let dlsym = real_dlsym().ok_or(LoadError::NoRealDlsym)?;
        // SAFETY: NUL-terminated path; dlopen is thread-safe.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                format!("cannot load {}", path.to_string_lossy())
            } else {
                // SAFETY: non-NULL dlerror string, copied before anything else calls dl*.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(LoadError::Open(msg));
        }
        Ok(Library { handle, dlsym })
    }

    /// The address of `name` in this library (and its dependencies), or NULL.
    pub(crate) fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { (self.dlsym)(self.handle, name.as_ptr()) }
    }
}
