//! The simulator is loaded as `libcuda.so.1` (and, through a symlink, `libnvidia-ml.so.1`).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
