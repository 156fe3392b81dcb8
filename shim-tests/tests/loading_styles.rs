//! The cap holds however a program reaches the driver: linked directly (default and per-thread-default-stream
//! builds), dlsym of the versioned names (and of the `_ptsz` names), and cuGetProcAddress / _v2 with the
//! CUDA versions and flags the runtime uses. Each test tries every allocation kind its style can resolve and
//! FAILS listing every path that escaped the cap.

use shim_tests::{Prog, Sim, GIB};

const ALL: &[&str] = &[
    "mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
];
/// What exists at cudaVersion 3020 with today's ABI (managed memory, pools, VMM, mipmaps came later).
const V3020: &[&str] = &["mem", "pitch", "array", "array3d"];
/// cudaVersion 2000: the v1 ABI (32-bit sizes) of cuMemAlloc / cuMemAllocPitch.
const V2000: &[&str] = &["mem", "pitch"];

fn check_style(prog: Prog, style: Option<&str>, kinds: &[&str]) {
    let mut escapes = Vec::new();
    for kind in kinds {
        let sim = Sim::new().build();
        let mut cmd = sim.cmd(prog).mem_limit("1g");
        if let Some(s) = style {
            cmd = cmd.style(s);
        }
        // over the cap first (must be refused without the driver seeing it), then one that fits
        let out = cmd
            .args(&format!(
                "init simused alloc:{kind}:1536m simused alloc:{kind}:512m simused info totalmem"
            ))
            .run();
        let name = format!("{} {kind}", style.unwrap_or("direct"));
        if !out.success() || out.get("init") != Some("CUDA_SUCCESS") || out.get("ctx") != Some("CUDA_SUCCESS")
        {
            escapes.push(format!("{name}: program failed{out:?}"));
            continue;
        }
        let used = |n| out.nth_num("sim.used.0", n);
        if out.get("alloc.0") != Some("CUDA_ERROR_OUT_OF_MEMORY") {
            escapes.push(format!(
                "{name}: 1536m over a 1g cap returned {:?}",
                out.get("alloc.0")
            ));
        }
        if used(1) != used(0) {
            escapes.push(format!(
                "{name}: the driver was asked for an over-cap allocation ({} → {})",
                used(0),
                used(1)
            ));
        }
        if out.get("alloc.1") != Some("CUDA_SUCCESS") {
            escapes.push(format!(
                "{name}: 512m under the cap returned {:?}{out:?}",
                out.get("alloc.1")
            ));
        } else if used(2) <= used(1) {
            escapes.push(format!(
                "{name}: 512m succeeded but the simulator saw nothing{out:?}"
            ));
        }
        if out.get("info.total").and_then(|v| v.parse::<u64>().ok()) != Some(GIB) {
            escapes.push(format!(
                "{name}: cuMemGetInfo total {:?} != cap",
                out.get("info.total")
            ));
        }
        if out.get("totalmem").and_then(|v| v.parse::<u64>().ok()) != Some(GIB) {
            escapes.push(format!(
                "{name}: cuDeviceTotalMem {:?} != cap",
                out.get("totalmem")
            ));
        }
    }
    assert!(
        escapes.is_empty(),
        "paths that escape the cap:\n{}",
        escapes.join("\n")
    );
}

#[test]
fn direct_link() {
    check_style(Prog::ProbeDirect, None, ALL);
}

#[test]
fn direct_link_per_thread_default_stream() {
    check_style(Prog::ProbeDirectPtds, None, ALL);
}

#[test]
fn dlsym_versioned_names() {
    check_style(Prog::Probe, Some("dlsym"), ALL);
}

#[test]
fn dlsym_ptsz_names() {
    check_style(Prog::Probe, Some("dlsym-ptsz"), ALL);
}

#[test]
fn get_proc_address_v2_12000_default() {
    check_style(Prog::Probe, Some("gpa:12000:0"), ALL);
}

#[test]
fn get_proc_address_v2_12000_per_thread_default_stream() {
    check_style(Prog::Probe, Some("gpa:12000:2"), ALL);
}

#[test]
fn get_proc_address_v2_12000_legacy_stream() {
    check_style(Prog::Probe, Some("gpa:12000:1"), ALL);
}

#[test]
fn get_proc_address_v2_13000() {
    check_style(Prog::Probe, Some("gpa:13000:0"), ALL);
}

#[test]
fn get_proc_address_v2_3020() {
    check_style(Prog::Probe, Some("gpa:3020:0"), V3020);
}

#[test]
fn get_proc_address_v2_2000_v1_abi() {
    check_style(Prog::Probe, Some("gpa:2000:0"), V2000);
}

#[test]
fn get_proc_address_v1_entry_point() {
    check_style(Prog::Probe, Some("gpa1:12000:0"), ALL);
    check_style(Prog::Probe, Some("gpa1:12000:2"), &["async", "pool"]);
}
