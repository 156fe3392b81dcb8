//! CUDA driver exports: one per `hooked` line of `driver::cuda::cuda_functions!`. Everything else is not
//! exported and is served by the real driver ("forward by default").

use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::state::Shim;
use std::ffi::{c_char, c_int, c_uint, c_void};

fn table(s: &Shim) -> &CudaTable {
    &s.cuda
}

macro_rules! cuda_exports {
    ($($list:tt)*) => {
        crate::abi::exports!(cuda_guard, CUresult, table, $($list)*);
    };
}
crate::driver::cuda::cuda_functions!(cuda_exports);
