//! A simulated NVIDIA GPU: stands in for `libcuda.so.1` **and** `libnvidia-ml.so.1` (tests symlink both
//! names to `libcudasim.so`; the soname is libcuda.so.1, so either name gives this one library and one state).
//!
//! Programs compiled against NVIDIA's real `cuda.h` / `nvml.h` run on it unchanged: devices, contexts, memory
//! (really backed, so data round-trips), modules, streams, events, graphs, pools, arrays, VMM, NVML. Kernels
//! compute nothing but take simulated time on a per-device timeline shared by every process using the same
//! state file (`CUDASIM_STATE`), which is what memory caps and SM-time limits are measured against.
//!
//! Layout: `abi/` holds every export (thin, panic-safe wrappers); the other modules are plain Rust, one job
//! each: `config` (env), `state` (the shared file), `sim` (process-wide state), `device` (visibility and
//! attributes), `context`, `memory`, `ipc`, `pool`, `vmm`, `array`, `code` (compiled images), `module`, `stream`, `timeline`, `launch`,
//! `graph`, `nvml`, `proc_address` (+ the generated `proc_table` and `stubs`), `export_table` (the runtime's
//! private tables), `errors`, `fault` (injected errors, `CUDASIM_FAULT`), `types` (header values and layouts).

mod abi;
mod array;
mod code;
mod config;
mod context;
mod device;
mod errors;
mod export_table;
mod fault;
mod graph;
mod graph_mem;
mod ipc;
mod launch;
mod managed;
mod memory;
mod module;
mod nvml;
mod objects;
mod pid_service;
mod pool;
mod proc_address;
mod proc_table;
mod sim;
mod state;
mod stream;
mod stubs;
mod timeline;
mod touch;
mod types;
mod vmm;
