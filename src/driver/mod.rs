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

pub mod cuda;
pub mod dl;
pub mod nvml;
pub mod proc_map;

#[cfg(test)]
mod header_check;

use std::ffi::{c_void, CStr};

pub use dl::{real_dlsym, DlsymFn};

/// Why a library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
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
pub struct Library {
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
    pub fn open(path: &CStr) -> Result<Library, LoadError> {
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
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { (self.dlsym)(self.handle, name.as_ptr()) }
    }
}

/// Generates a table of optional function pointers from a list of C signatures (the lines of
/// `cuda_functions!` / `nvml_functions!`; versions and hooks are not its business), one method per entry that
/// calls the real function or returns the table's "missing" code, and `load`/`empty` constructors.
macro_rules! function_table {
    (
        $(#[$meta:meta])*
        $table:ident -> $ret:ty;
        missing_library = $nolib:expr, missing_symbol = $nosym:expr;
        [ $( $name:ident $(@ $ver:literal)? ( $( $arg:ident : $ty:ty ),* $(,)? )
             $(=> $hm:ident :: $hf:ident ( $($e:expr),* $(,)? ))? ; )* ]
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        #[derive(Clone)]
        pub struct $table {
            /// False when the table was built without a library (every call returns the missing-library code).
            pub loaded: bool,
            $( #[doc = concat!("`", stringify!($name), "`")] pub $name: Option<unsafe extern "C" fn($($ty),*) -> $ret>, )*
        }

        #[allow(non_snake_case, clippy::too_many_arguments, dead_code)]
        impl $table {
            /// A table with no functions (used when the library cannot be loaded, and as the base of test fakes).
            pub fn empty(loaded: bool) -> Self {
                Self { loaded, $( $name: None, )* }
            }

            /// Resolves every entry in `lib`; a missing symbol leaves its entry `None`.
            pub fn load(lib: &$crate::driver::Library) -> Self {
                let mut t = Self::empty(true);
                $(
                    let p = lib.symbol(
                        // SAFETY: the literal is NUL-terminated by `concat!` and contains no other NUL.
                        unsafe { std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) }
                    );
                    // SAFETY: `p` is NULL or the address of the C function of that name, whose signature is the one
                    // transcribed from NVIDIA's header; Option<fn> has the NULL niche.
                    t.$name = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Option<unsafe extern "C" fn($($ty),*) -> $ret>>(p) };
                )*
                t
            }

            /// The code a call returns when its function is unavailable.
            pub fn missing(&self) -> $ret {
                if self.loaded { $nosym } else { $nolib }
            }

            /// `(name, address)` of every resolved entry (for the cuGetProcAddress reverse map).
            pub fn resolved(&self) -> Vec<(&'static str, usize)> {
                let mut v = Vec::new();
                $( if let Some(f) = self.$name { v.push((stringify!($name), f as usize)); } )*
                v
            }

            $(
                #[doc = concat!("Calls the real `", stringify!($name), "`.")]
                #[doc = ""]
                #[doc = "# Safety"]
                #[doc = "The arguments must satisfy the C function's contract."]
                #[inline]
                pub unsafe fn $name(&self, $( $arg: $ty ),*) -> $ret {
                    match self.$name {
                        // SAFETY: forwarded under the caller's contract.
                        Some(f) => unsafe { f($($arg),*) },
                        None => self.missing(),
                    }
                }
            )*
        }
    };
}
pub(crate) use function_table;
