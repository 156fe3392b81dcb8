//! The real `libcuda.so.1`: its table of functions ([`CudaTable`], generated in `ffi::cuda` from the list of
//! every CUDA function cuquota calls or exports, checked against NVIDIA's headers).

pub(crate) use crate::ffi::cuda::CudaTable;

use super::Library;

/// Every function of the table, resolved in `lib` (a missing one returns `CUDA_ERROR_NOT_FOUND` when called).
pub(crate) fn load(lib: &Library) -> CudaTable {
    // SAFETY: `Library::symbol` returns NULL or the address of that name in a library never closed.
    unsafe { CudaTable::load(|name| lib.symbol(name)) }
}
