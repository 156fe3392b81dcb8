//! libcuquota.so: caps device memory and GPU time for the processes of one container.
//!
//! Layout of one call: `abi` (exported C symbols) → `hooks` (decisions) → policy (`memory`, `throttle`)
//! → `driver` (the real libcuda / libnvidia-ml). See DESIGN.md and docs/interception.md.

mod abi;
mod devices;
mod driver;
mod hooks;
mod locks;
mod log;
mod memory;
mod state;
mod throttle;
mod time;

/// The CUDA and NVML declarations (types, signatures, function tables), checked against NVIDIA's headers.
use cuquota_ffi as ffi;
