//! Hooks: plain Rust functions, one per export, named like the export they serve (the `abi` macros call
//! `crate::hooks::<name>(shim, args…)`). Each decides (allow, refuse, rewrite the answer) and calls the real
//! driver through `Shim::cuda` / `Shim::nvml`, so each is unit-testable with a fake driver table.

pub mod context;
pub mod graph_memory;
pub mod info;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod proc_address;

pub use context::*;
pub use graph_memory::*;
pub use info::*;
pub use launch::*;
pub use memory::*;
pub use proc_address::*;

#[cfg(test)]
mod tests;
