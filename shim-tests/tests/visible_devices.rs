//! CUDA_VISIBLE_DEVICES with indices, reordered indices, `GPU-…` and `MIG-…` UUIDs, and per-ordinal caps
//! (`CUDA_DEVICE_MEMORY_LIMIT_<i>`): each allocation is charged to the physical device it lands on.

use shim_tests::{mig_uuid_of, Output, Prog, Sim, GIB, MIB};

const U0: &str = "GPU-aaaaaaaa-2222-4333-8444-555555555500";
const U1: &str = "GPU-bbbbbbbb-2222-4333-8444-555555555501";

fn two_gpus() -> Sim {
    Sim::new()
        .devices(2)
        .memory("16g")
        .uuids(&format!("{U0},{U1}"))
        .build()
}

fn used(out: &Output, phys: usize, n: usize) -> u64 {
    out.nth_num(&format!("sim.used.{phys}"), n)
}

#[test]
fn reordered_indices_with_per_device_caps() {
    let sim = two_gpus();
    let out = sim
        .cmd(Prog::Probe)
        .env("CUDA_VISIBLE_DEVICES", "1,0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g")
        .args("init count uuid totalmem simused alloc:mem:768m simused alloc:mem:512m")
        .args("dev:1 uuid totalmem simused alloc:mem:1536m simused alloc:mem:768m info")
        .run();
    out.ok();
    assert_eq!(out.num("count"), 2, "{out:?}");
    // ordinal 0 is physical 1, capped at 1g
    assert_eq!(out.all("uuid")[0], U1, "{out:?}");
    assert_eq!(out.nth_num("totalmem", 0), GIB, "{out:?}");
    out.expect("alloc.0", "CUDA_SUCCESS");
    assert!(
        used(&out, 1, 1) >= used(&out, 1, 0) + 768 * MIB,
        "768m should land on physical 1:{out:?}"
    );
    assert_eq!(
        used(&out, 0, 1),
        used(&out, 0, 0),
        "physical 0 was charged for ordinal 0's memory:{out:?}"
    );
    assert_eq!(
        out.val("alloc.1"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "ordinal 0's 1g cap:{out:?}"
    );
    // ordinal 1 is physical 0, capped at 2g: ordinal 0's usage does not count there
    assert_eq!(out.all("uuid")[1], U0, "{out:?}");
    assert_eq!(out.nth_num("totalmem", 1), 2 * GIB, "{out:?}");
    out.expect("alloc.2", "CUDA_SUCCESS");
    assert!(
        used(&out, 0, 3) >= used(&out, 0, 2) + 1536 * MIB,
        "1536m should land on physical 0:{out:?}"
    );
    assert_eq!(
        out.val("alloc.3"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "ordinal 1's 2g cap:{out:?}"
    );
    assert_eq!(out.num("info.total"), 2 * GIB, "{out:?}");
    assert_eq!(out.num("info.free"), 512 * MIB, "{out:?}");
}

fn single_visible(entry: &str, phys: usize) {
    let sim = two_gpus();
    let out = sim
        .cmd(Prog::Probe)
        .env("CUDA_VISIBLE_DEVICES", entry)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .args("init count totalmem simused alloc:mem:768m simused alloc:mem:512m")
        .run();
    out.ok();
    assert_eq!(out.num("count"), 1, "{entry}:{out:?}");
    assert_eq!(out.num("totalmem"), GIB, "{entry}:{out:?}");
    out.expect("alloc.0", "CUDA_SUCCESS");
    let other = 1 - phys;
    assert!(
        used(&out, phys, 1) >= used(&out, phys, 0) + 768 * MIB,
        "{entry}: not on physical {phys}:{out:?}"
    );
    assert_eq!(
        used(&out, other, 1),
        used(&out, other, 0),
        "{entry}: physical {other} charged:{out:?}"
    );
    out.expect("alloc.1", "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn gpu_uuid_selects_the_second_card() {
    single_visible(U1, 1);
}

#[test]
fn gpu_uuid_prefix_selects_the_second_card() {
    // CUDA accepts a unique prefix of the UUID
    single_visible("GPU-bbbbbbbb", 1);
}

#[test]
fn mig_uuid_selects_the_second_card() {
    single_visible(&mig_uuid_of(U1), 1);
}

#[test]
fn index_selects_the_second_card() {
    single_visible("1", 1);
}

/// Two processes of one container see the cards in different orders; the shared usage is kept per physical
/// device, so each one's charge counts against the right card only.
#[test]
fn processes_with_different_orders_share_per_physical_device() {
    let sim = two_gpus();
    let mut a = sim
        .cmd(Prog::Probe)
        .env("CUDA_VISIBLE_DEVICES", "1")
        .mem_limit("1g")
        .args("init alloc:mem:768m wait")
        .spawn();
    a.wait_ready(1);
    let b = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:900m dev:1 alloc:mem:512m info")
        .run();
    b.ok();
    assert_eq!(
        b.val("alloc.0"),
        "CUDA_SUCCESS",
        "physical 0 is free in this container:{b:?}"
    );
    assert_eq!(
        b.val("alloc.1"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "physical 1 already holds 768m of this container (charged by a process that calls it ordinal 0):{b:?}"
    );
    assert_eq!(b.num("info.free"), GIB - 768 * MIB, "{b:?}");
    a.finish().ok();
}

/// NVML indexes physical devices; an NVML-only process maps them to ordinals by CUDA_VISIBLE_DEVICES.
#[test]
fn nvml_maps_physical_devices_to_ordinal_caps() {
    let sim = two_gpus();
    let out = sim
        .cmd(Prog::NvmlProbe)
        .env("CUDA_VISIBLE_DEVICES", &format!("{U1},{U0}"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "3g")
        .args("uuid:0 uuid:1 mem:0 mem:1")
        .run();
    out.ok();
    let (i0, i1) = if out.val("uuid.0") == U0 { (0, 1) } else { (1, 0) };
    assert_eq!(
        out.num(&format!("mem.{i1}.total")),
        GIB,
        "physical 1 is ordinal 0 (1g):{out:?}"
    );
    assert_eq!(
        out.num(&format!("mem.{i0}.total")),
        3 * GIB,
        "physical 0 is ordinal 1 (3g):{out:?}"
    );
}
