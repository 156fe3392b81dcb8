//! The inline tamper check of the usage file (`UsageRegion::intact`, issue 22): every header word it compares,
//! changed alone by another process of the container while a victim runs, fails closed as the full validation
//! did. region_robust.rs covers garbage (magic), zero and truncation; these cover the words one at a
//! time. Judged by the simulator's own figures.

use shim_tests::{Prog, Sim};
use std::os::unix::fs::FileExt;

const MIB: u64 = 1 << 20;

/// A victim under a 1 GiB cap holds 512 MiB; `bytes` are written at `offset` of the usage file's header; then
/// it asks for 256 MiB (within the cap by its own view): refused, and the simulator stays under the cap.
fn tamper(name: &str, offset: u64, bytes: &[u8]) {
    let sim = Sim::new().build();
    let usage = sim.usage_file();
    let mut victim = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:512m wait alloc:mem:256m alloc:mem:768m simused")
        .spawn();
    victim.wait_ready(1);
    let f = std::fs::OpenOptions::new().write(true).open(&usage).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    drop(f);
    victim.release();
    let out = victim.finish();
    println!("{name}: {out:?}");
    assert!(out.success(), "{name}: victim died: {out:?}");
    out.expect("alloc.0", "CUDA_SUCCESS");
    out.expect("alloc.1", "CUDA_ERROR_OUT_OF_MEMORY");
    out.expect("alloc.2", "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(out.num("sim.used.0") <= 1024 * MIB, "{name}: past the cap");
    assert!(
        out.stderr.contains(name),
        "{name}: the refusal does not name the word: {}",
        out.stderr
    );
}

#[test]
fn each_usage_header_word_tampered_alone_fails_closed() {
    // UsageHeader (repr C): magic u64 @0, abi_version u32 @8, header_size u32 @12, total_size u64 @16,
    // max_devices u32 @24, max_procs u32 @28.
    tamper("magic", 0, &0x0123_4567_89ab_cdefu64.to_ne_bytes());
    tamper("version", 8, &0xffffu32.to_ne_bytes());
    tamper("header_size", 12, &0xffffu32.to_ne_bytes());
    tamper("total_size", 16, &1u64.to_ne_bytes());
    tamper("max_devices", 24, &0xffffu32.to_ne_bytes());
    tamper("max_procs", 28, &0xffffu32.to_ne_bytes());
}
