//! The simulator is loaded as `libcuda.so.1` (and, through a symlink, `libnvidia-ml.so.1`).
//!
//! `-Bsymbolic-functions`: like NVIDIA's library, calls between the simulator's own entry points (a `_ptsz`
//! variant calling the plain one, say) stay inside it instead of going through the PLT, where a preloaded
//! interposer would see — and charge — them a second time.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
}
