//! CUDA driver exports: one per entry of `driver::cuda::cuda_hooked!`. Everything else is not exported and is
//! served by the real driver ("forward by default").

use crate::ffi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

macro_rules! cuda_exports {
    ( [ $($list:tt)* ] ) => {
        crate::abi::exports!(cuda_guard, CUresult, crate::hooks, [ $($list)* ]);
    };
}
crate::driver::cuda::cuda_hooked!(cuda_exports);
