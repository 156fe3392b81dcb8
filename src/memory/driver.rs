//! The driver queries memory's pricing asks, behind one trait (as the throttle's `Gpu`): the real table in
//! the shim, a fake in unit tests. So far the stack's pricing (`stack`) goes through it; the families' other
//! queries still take the `CudaTable`.

use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use std::ffi::c_int;

/// What pricing asks the driver. Each answer is the driver's, or its error.
pub(crate) trait Driver {
    /// `cuDeviceGetAttribute` of device `ordinal`.
    fn device_attribute(&self, attr: CUdevice_attribute, ordinal: CUdevice) -> Result<c_int, CUresult>;
    /// `cuFuncGetAttribute`'s `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` of `f` (a `CUfunction`).
    fn function_local_size(&self, f: CUfunction) -> Result<c_int, CUresult>;
    /// `cuKernelGetAttribute`'s `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` of `f` (a `CUkernel`) on device `ordinal`.
    fn kernel_local_size(&self, f: CUfunction, ordinal: CUdevice) -> Result<c_int, CUresult>;
    /// `cuCtxGetLimit(CU_LIMIT_STACK_SIZE)` of the current context.
    fn stack_size(&self) -> Result<usize, CUresult>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> Result<c_int, CUresult>;
}

fn answer<T>(r: CUresult, v: T) -> Result<T, CUresult> {
    if r.ok() {
        Ok(v)
    } else {
        Err(r)
    }
}

impl Driver for CudaTable {
    fn device_attribute(&self, attr: CUdevice_attribute, ordinal: CUdevice) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetAttribute(&mut n, attr, ordinal) };
        answer(r, n)
    }

    fn function_local_size(&self, f: CUfunction) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; `f` is the program's handle, which the driver checks.
        let r = unsafe { self.cuFuncGetAttribute(&mut n, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) };
        answer(r, n)
    }

    fn kernel_local_size(&self, f: CUfunction, ordinal: CUdevice) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: as above.
        let r = unsafe { self.cuKernelGetAttribute(&mut n, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f, ordinal) };
        answer(r, n)
    }

    fn stack_size(&self) -> Result<usize, CUresult> {
        let mut n: usize = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuCtxGetLimit(&mut n, CU_LIMIT_STACK_SIZE) };
        answer(r, n)
    }

    fn device_count(&self) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { self.cuDeviceGetCount(&mut n) };
        answer(r, n)
    }
}
