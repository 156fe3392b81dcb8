//! Hooks: plain Rust functions that decide (allow, refuse, rewrite the answer) and call the real driver. Each
//! line of the routing lists (`abi::cuda`, `abi::nvml`) names the hook
//! its export runs, `hooks::<module>::<hook>(shim, …)`, with `call` (the real function with the caller's
//! arguments) or `real` (the real function) among the arguments. So one hook serves every form of a call
//! (`_v2`, legacy 32-bit, `_ptsz`), and each is unit-testable with a fake driver table.

pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod graph_memory;
pub(crate) mod image_copy;
pub(crate) mod info;
pub(crate) mod launch;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod nvml;
pub(crate) mod proc_address;

#[cfg(test)]
mod tests;

use crate::ffi::cuda::{CUstream, DefaultStream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use std::ffi::c_uint;

/// Stream for probe events: the NULL stream is the legacy or the per-thread default stream.
#[inline]
pub(crate) fn probe_stream(stream: CUstream, ds: DefaultStream) -> usize {
    match (stream as usize, ds) {
        (0, DefaultStream::PerThread) => CU_STREAM_PER_THREAD,
        (0, DefaultStream::Legacy) => CU_STREAM_LEGACY,
        (s, _) => s,
    }
}

/// An integer in the caller's C width: the legacy 32-bit ABI's sizes and addresses (`c_uint`,
/// `CUdeviceptr_v1`) and the current 64-bit ones. Writing back saturates.
pub(crate) trait Width: Copy + Default {
    /// `v`, saturated to this width.
    fn from_u64(v: u64) -> Self;
    /// The value as 64 bits.
    fn to_u64(self) -> u64;
}

impl Width for usize {
    fn from_u64(v: u64) -> Self {
        usize::try_from(v).unwrap_or(usize::MAX)
    }
    fn to_u64(self) -> u64 {
        self as u64
    }
}

impl Width for c_uint {
    fn from_u64(v: u64) -> Self {
        c_uint::try_from(v).unwrap_or(c_uint::MAX)
    }
    fn to_u64(self) -> u64 {
        self as u64
    }
}

impl Width for u64 {
    fn from_u64(v: u64) -> Self {
        v
    }
    fn to_u64(self) -> u64 {
        self
    }
}
