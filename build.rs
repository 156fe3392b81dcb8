//! Gives the preload library its soname so `ldd` and `/etc/ld.so.preload` name it predictably.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuquota.so");
    println!("cargo:rerun-if-changed=build.rs");
}
