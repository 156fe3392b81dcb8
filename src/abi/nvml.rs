//! NVML exports: one per `hooked` line of `driver::nvml::nvml_functions!`.

use crate::driver::nvml::NvmlTable;
use crate::ffi::nvml::*;
use crate::state::Shim;
use std::ffi::{c_char, c_uint};

fn table(s: &Shim) -> &NvmlTable {
    s.nvml.real()
}

macro_rules! nvml_exports {
    ($($list:tt)*) => {
        crate::abi::exports!(nvml_guard, nvmlReturn_t, table, $($list)*);
    };
}
crate::driver::nvml::nvml_functions!(nvml_exports);
