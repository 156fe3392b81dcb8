//! The CUDA driver API and NVML as cuquota uses them (the preload library and the `cuquota` tool): C types,
//! constants, struct layouts and function signatures, transcribed from NVIDIA's `cuda.h` and `nvml.h` (CUDA
//! 13.0), and the tables of function pointers generated from the signatures. Each is declared through one of the
//! macros below, which also lists it for `header_check`: a test that compiles a C file against the real
//! headers in `.deps` asserting every signature, size, offset, signedness and value.
//!
//! Why hand-written rather than bindgen: the set is small, the build must not need libclang, and keeping the
//! handle types as plain pointers/integers keeps the export signatures readable.

pub mod cuda;
pub mod dlfcn;
pub mod nvml;
#[cfg(feature = "loader")]
pub mod nvml_loader;

#[cfg(test)]
mod header_check;

/// One struct as the header check sees it.
#[cfg(test)]
#[derive(Debug)]
pub struct StructCheck {
    /// The C type (a name, or a `__typeof__` expression for an anonymous struct).
    pub c: &'static str,
    /// `size_of` of our definition.
    pub size: usize,
    /// `(C field name, offset, size)` per field.
    pub fields: Vec<(&'static str, usize, usize)>,
}

/// What the header check asserts of a type alias: its size and, for integers, its signedness.
#[cfg(test)]
pub trait CheckedType {
    /// `Some(signed)` for an integer, `None` for a pointer.
    const SIGNED: Option<bool>;
    /// A stand-in for an opaque C type only ever used behind a pointer: nothing to check.
    const OPAQUE: bool = false;
}

#[cfg(test)]
macro_rules! checked_ints {
    ($($t:ty => $s:expr),*) => { $( impl CheckedType for $t { const SIGNED: Option<bool> = Some($s); } )* };
}
#[cfg(test)]
checked_ints!(i32 => true, u32 => false, i64 => true, u64 => false, usize => false, u8 => false, u16 => false);
#[cfg(test)]
impl<T> CheckedType for *mut T {
    const SIGNED: Option<bool> = None;
}
#[cfg(test)]
impl<T> CheckedType for *const T {
    const SIGNED: Option<bool> = None;
}
#[cfg(test)]
impl CheckedType for std::ffi::c_void {
    const SIGNED: Option<bool> = None;
    const OPAQUE: bool = true;
}

/// `(C name, size, signedness or None, opaque)` of a type, for the header check.
#[cfg(test)]
pub type AliasCheck = (&'static str, usize, Option<bool>, bool);

/// Type aliases named as in the header: `pub type CUdevice = c_int;`. Lists them as `$list()`.
macro_rules! c_aliases {
    ($list:ident; $( $(#[$m:meta])* pub type $name:ident = $ty:ty; )*) => {
        $( $(#[$m])* pub type $name = $ty; )*

        /// Every alias above, for `header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<crate::AliasCheck> {
            use crate::CheckedType;
            vec![ $( (
                stringify!($name),
                if <$ty as CheckedType>::OPAQUE { 0 } else { std::mem::size_of::<$ty>() },
                <$ty as CheckedType>::SIGNED,
                <$ty as CheckedType>::OPAQUE,
            ) ),* ]
        }
    };
}
pub(crate) use c_aliases;

/// Constants with the header's values: `NAME: Type = value;`, or `NAME: Type = value => "C expression";` when the
/// header spells it otherwise. Lists them as `$list()`.
macro_rules! c_consts {
    ($list:ident; $( $(#[$m:meta])* $name:ident : $ty:ty = $val:expr $(=> $c:literal)? ; )*) => {
        $( $(#[$m])* pub const $name: $ty = $val; )*

        /// `(C expression, value)` of every constant above, for `header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<(&'static str, i128)> {
            vec![ $( (crate::c_name!($name $($c)?), $name as i128) ),* ]
        }
    };
}
pub(crate) use c_consts;

/// Result codes as associated constants of a newtype: `SUCCESS = 0 => "CUDA_SUCCESS";`. Lists them as
/// `$list()`.
macro_rules! c_codes {
    ($ty:ident, $list:ident; $( $name:ident = $val:literal => $c:literal; )*) => {
        #[allow(missing_docs)]
        impl $ty {
            $( pub const $name: Self = Self($val); )*
        }

        /// `(C name, value)` of every code above, for `header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<(&'static str, i128)> {
            vec![ $( ($c, $val as i128) ),* ]
        }
    };
}
pub(crate) use c_codes;

/// `#[repr(C)]` structs mirroring the header's: fields in header order, `field as "c_name": Type` where the
/// header's name is a Rust keyword; `struct Name as "C type"` where the header names the type otherwise. Lists
/// them as `$list()`.
macro_rules! c_structs {
    ($list:ident; $(
        $(#[$m:meta])* pub struct $name:ident $(as $cname:literal)? {
            $( $(#[$fm:meta])* pub $f:ident $(as $cf:literal)? : $ft:ty ),* $(,)?
        }
    )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            pub struct $name { $( $(#[$fm])* pub $f: $ft ),* }
        )*

        /// Every struct above, for `header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<crate::StructCheck> {
            fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
                std::mem::size_of::<F>()
            }
            vec![ $( crate::StructCheck {
                c: crate::c_name!($name $($cname)?),
                size: std::mem::size_of::<$name>(),
                fields: vec![ $( (
                    crate::c_name!($f $($cf)?),
                    std::mem::offset_of!($name, $f),
                    field_size(|s: &$name| &s.$f),
                ) ),* ],
            } ),* ]
        }
    };
}
pub(crate) use c_structs;

/// The C name: the Rust one unless given.
#[cfg(test)]
macro_rules! c_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident $c:literal) => {
        $c
    };
}
#[cfg(test)]
pub(crate) use c_name;

/// One function of a list, as the header check sees it: name, CUDA ABI version (NVML: none), argument
/// `(name, type as Rust spells it)`.
#[cfg(test)]
#[derive(Debug)]
pub struct FunctionCheck {
    /// The C name.
    pub name: &'static str,
    /// The `@version` of a CUDA line (`PFN_<name>_v<version>` in `cudaTypedefs.h`).
    pub version: Option<u32>,
    /// `(name, Rust type)` per argument.
    pub args: Vec<(&'static str, &'static str)>,
}

/// A list of C functions that all return `$ret`, one line each: `name @version (arg: Type, …);` (`@version`, the
/// CUDA ABI version of `cudaTypedefs.h`'s `PFN_<name>_v<version>`, for CUDA lines only). Generates
/// - `$table`: one optional function pointer per line, `load` (resolve each by name), `empty`, and a method per
///   line that calls the real function or returns the "missing" code (`$nolib` for a table built without a
///   library, `$nosym` for a symbol the library lacks);
/// - `params::<name>`: a module per line with a type alias per argument, named as the argument, and `NAMES`
///   (the argument names in order): what an export of that function declares (`cuquota`'s `abi`);
/// - `$list()`, every line for `header_check`.
macro_rules! c_functions {
    (
        $(#[$meta:meta])*
        $table:ident -> $ret:ty, $list:ident;
        missing_library = $nolib:expr, missing_symbol = $nosym:expr;
        $( $name:ident $(@ $ver:literal)? ( $( $arg:ident : $ty:ty ),* $(,)? ); )*
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        #[derive(Debug, Clone)]
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

            /// Resolves every entry with `symbol` (the address of a name in the loaded library, or NULL); a
            /// missing symbol leaves its entry `None`.
            ///
            /// # Safety
            /// `symbol` returns NULL or the address of the C function of that name, from a library that stays
            /// loaded as long as the table is used.
            pub unsafe fn load(mut symbol: impl FnMut(&std::ffi::CStr) -> *mut std::ffi::c_void) -> Self {
                let mut t = Self::empty(true);
                $(
                    let p = symbol(
                        // SAFETY: the literal is NUL-terminated by `concat!` and contains no other NUL.
                        unsafe { std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) }
                    );
                    // SAFETY: `p` is NULL or the address of the C function of that name (the caller's contract),
                    // whose signature is the one transcribed from NVIDIA's header; Option<fn> has the NULL niche.
                    t.$name = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Option<unsafe extern "C" fn($($ty),*) -> $ret>>(p) };
                )*
                t
            }

            /// The code a call returns when its function is unavailable.
            #[inline]
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

        /// The arguments of each function of the list: one module per function, one type alias per argument.
        #[allow(non_snake_case, non_camel_case_types)]
        pub mod params {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[doc = concat!("`", stringify!($name), "`'s arguments.")]
                pub mod $name {
                    #[allow(unused_imports)]
                    use super::*;
                    $( #[doc = concat!("`", stringify!($arg), "`")] pub type $arg = $ty; )*
                    /// The argument names in order.
                    pub const NAMES: &str = stringify!($($arg),*);
                }
            )*
        }

        /// Every function above, for `header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<crate::FunctionCheck> {
            vec![ $( crate::FunctionCheck {
                name: stringify!($name),
                version: None $(.or(Some($ver)))?,
                args: vec![ $( (stringify!($arg), stringify!($ty)) ),* ],
            } ),* ]
        }
    };
}
pub(crate) use c_functions;

/// `a == b`, at compile time (an export's argument names against [`params`](cuda::params)' `NAMES`).
pub const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
