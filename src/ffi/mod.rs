//! C types, constants and struct layouts of the CUDA driver API and NVML, transcribed from NVIDIA's `cuda.h`
//! and `nvml.h` (CUDA 13.0). Only what the shim needs; every layout is checked against the header by the
//! size/offset tests at the bottom of each file.
//!
//! Why hand-written rather than bindgen: the set is small, the build must not need libclang, and keeping the
//! handle types as plain pointers/integers keeps the export signatures readable.

pub mod cuda;
pub mod nvml;
