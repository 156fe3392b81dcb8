//! libcuquota.so: caps device memory and GPU time for the processes of one container.
//!
//! Layout of one call: `abi` (exported C symbols) → `hooks` (decisions) → policy (`memory`, `throttle`)
//! → `driver` (the real libcuda / libnvidia-ml). See DESIGN.md.
#![deny(unsafe_op_in_unsafe_fn)]
