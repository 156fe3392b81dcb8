//! C types, constants and struct layouts of the CUDA driver API and NVML: only what the shim needs, transcribed
//! from NVIDIA's `cuda.h` and `nvml.h` (CUDA 13.0). Each is declared through one of the macros below, which also
//! lists it for `driver::header_check`: a test that compiles a C file against the real headers in `.deps`
//! asserting every size, offset, signedness and value (and every function signature, from the driver lists).
//!
//! Why hand-written rather than bindgen: the set is small, the build must not need libclang, and keeping the
//! handle types as plain pointers/integers keeps the export signatures readable.

pub mod cuda;
pub mod nvml;

/// One struct as the header check sees it.
#[cfg(test)]
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

        /// Every alias above, for `driver::header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<crate::ffi::AliasCheck> {
            use crate::ffi::CheckedType;
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

        /// `(C expression, value)` of every constant above, for `driver::header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<(&'static str, i128)> {
            vec![ $( (crate::ffi::c_name!($name $($c)?), $name as i128) ),* ]
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

        /// `(C name, value)` of every code above, for `driver::header_check`.
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

        /// Every struct above, for `driver::header_check`.
        #[cfg(test)]
        pub fn $list() -> Vec<crate::ffi::StructCheck> {
            fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
                std::mem::size_of::<F>()
            }
            vec![ $( crate::ffi::StructCheck {
                c: crate::ffi::c_name!($name $($cname)?),
                size: std::mem::size_of::<$name>(),
                fields: vec![ $( (
                    crate::ffi::c_name!($f $($cf)?),
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
