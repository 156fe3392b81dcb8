//! libcuquota.so: caps device memory and GPU time for the processes of one container.
//!
//! Layout of one call: `abi` (exported C symbols) → `hooks` (decisions) → policy (`memory`, `throttle`)
//! → `driver` (the real libcuda / libnvidia-ml). See DESIGN.md and docs/interception.md.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod devices;
pub mod driver;
pub mod hooks;
pub mod locks;
pub mod log;
pub mod memory;
pub mod state;
pub mod throttle;
pub mod time;

/// The CUDA and NVML declarations (types, signatures, function tables), checked against NVIDIA's headers.
pub use cuquota_ffi as ffi;
