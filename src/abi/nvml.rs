//! NVML exports: one per entry of `driver::nvml::nvml_hooked!`.

use crate::ffi::nvml::*;
use std::ffi::c_uint;

macro_rules! nvml_exports {
    ( [ $($list:tt)* ] ) => {
        crate::abi::exports!(nvml_guard, nvmlReturn_t, crate::hooks::nvml, [ $($list)* ]);
    };
}
crate::driver::nvml::nvml_hooked!(nvml_exports);
