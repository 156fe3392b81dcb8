//! Every allocation API under and over the cap: over the cap → CUDA_ERROR_OUT_OF_MEMORY and the simulator
//! shows the driver was not asked; every free/destroy returns the charge. Plus cuMemGetInfo /
//! cuDeviceTotalMem, and untracked frees passed through.

use shim_tests::{probe, Prog, Sim, GIB, MIB};

const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const OK: &str = "CUDA_SUCCESS";

/// Cap 1 GiB on a 16 GiB GPU: 600m fits; a second 600m does not (the driver would have said yes);
/// after freeing the first, 600m fits again.
fn under_and_over(kind: &str) {
    let sim = Sim::new().build();
    let line = format!(
        "init simused alloc:{kind}:600m simused alloc:{kind}:600m simused free:0 simused alloc:{kind}:600m simused"
    );
    let out = probe(&sim, "1g", &line);
    out.ok().expect("init", OK).expect("ctx", OK);
    let used = |n| out.nth_num("sim.used.0", n);
    assert_eq!(
        out.val("alloc.0"),
        OK,
        "{kind}: 600m under a 1g cap must succeed:{out:?}"
    );
    assert!(
        used(1) >= used(0) + 600 * MIB,
        "{kind}: the simulator did not see the allocation:{out:?}"
    );
    assert_eq!(
        out.val("alloc.1"),
        OOM,
        "{kind}: 1200m over a 1g cap must fail:{out:?}"
    );
    assert_eq!(
        used(2),
        used(1),
        "{kind}: the driver was asked for an over-cap allocation:{out:?}"
    );
    assert_eq!(out.val("free.0"), OK, "{kind}: free:{out:?}");
    assert_eq!(
        out.val("alloc.2"),
        OK,
        "{kind}: the free did not return the charge:{out:?}"
    );
    if kind == "pool" {
        // The probe's pool keeps freed memory reserved (release threshold = max): the re-allocation is served
        // from that reserve, which the container is already charged for, so the driver must not grow.
        assert_eq!(
            used(4),
            used(3),
            "{kind}: the re-allocation should come from the pool's reserve:{out:?}"
        );
    } else {
        assert!(
            used(4) > used(3),
            "{kind}: the re-allocation did not reach the driver:{out:?}"
        );
    }
}

#[test]
fn mem_alloc() {
    under_and_over("mem");
}

#[test]
fn mem_alloc_pitch() {
    under_and_over("pitch");
}

#[test]
fn mem_alloc_managed() {
    under_and_over("managed");
}

#[test]
fn mem_alloc_async() {
    under_and_over("async");
}

#[test]
fn mem_alloc_from_pool_async() {
    under_and_over("pool");
}

#[test]
fn mem_create_release() {
    under_and_over("vmm");
}

#[test]
fn array_create() {
    under_and_over("array");
}

#[test]
fn array3d_create() {
    under_and_over("array3d");
}

#[test]
fn mipmapped_array_create() {
    under_and_over("mipmap");
}

/// A pool keeps freed memory reserved until trimmed; the reservation counts against the cap.
#[test]
fn pool_reservation_counted_until_trim() {
    let sim = Sim::new().build();
    let out = probe(
        &sim,
        "1g",
        "init alloc:pool:600m free:0 simused alloc:mem:600m simused trim alloc:mem:600m",
    );
    out.ok();
    out.expect("alloc.0", OK).expect("free.0", OK);
    let reserved = out.nth_num("sim.used.0", 0);
    assert!(
        reserved >= 600 * MIB,
        "the simulator's pool should keep 600m reserved after the free:{out:?}"
    );
    assert_eq!(
        out.val("alloc.1"),
        OOM,
        "a reserved-but-free pool block must still count:{out:?}"
    );
    assert_eq!(
        out.nth_num("sim.used.0", 1),
        reserved,
        "driver asked for an over-cap allocation:{out:?}"
    );
    out.expect("trim", OK);
    assert_eq!(
        out.val("alloc.2"),
        OK,
        "after trimming the pool its reservation must be returned:{out:?}"
    );
}

/// A fragmented reserve: two freed 400m blocks (800m reserved, charged, unused) cannot serve 600m, so the pool
/// would grow by the whole 600m — past the 1g cap. The shim must refuse it without asking the driver, yet still
/// serve a 400m re-allocation from the reserve.
#[test]
fn pool_fragmented_reserve_never_takes_the_container_over() {
    let sim = Sim::new().build();
    let out = probe(
        &sim,
        "1g",
        "init alloc:pool:400m alloc:pool:400m free:0 free:1 simused alloc:pool:600m simused alloc:pool:400m simused",
    );
    out.ok();
    out.expect("alloc.0", OK).expect("alloc.1", OK);
    let used = |n| out.nth_num("sim.used.0", n);
    assert!(
        used(0) >= 800 * MIB,
        "the pool should keep both freed blocks reserved:{out:?}"
    );
    assert_eq!(
        out.val("alloc.2"),
        OOM,
        "600m the fragmented reserve cannot serve must be refused:{out:?}"
    );
    assert_eq!(
        used(1),
        used(0),
        "the driver grew the pool for an allocation past the cap:{out:?}"
    );
    assert_eq!(
        out.val("alloc.3"),
        OK,
        "400m fits a freed block of the reserve:{out:?}"
    );
    assert_eq!(
        used(2),
        used(1),
        "the 400m re-allocation should come from the reserve:{out:?}"
    );
}

/// The shim's list of free reserve blocks must follow the blocks the driver really hands out. Here a 40m
/// allocation lands in a free 100m block (A) and is freed, so the shim lists A as 40m; a 90m request is then
/// served from A. A list matched by size alone would keep "A, 40m" and, near the cap, count on it for a 40m
/// request the remaining 20m blocks cannot serve — and the pool would grow past the cap.
#[test]
fn pool_free_blocks_follow_the_drivers_choice() {
    let sim = Sim::new().build();
    let out = probe(
        &sim,
        "1g",
        "init alloc:pool:100m alloc:pool:80m alloc:pool:20m alloc:pool:20m free:0 free:1 free:2 free:3 \
         alloc:pool:80m alloc:pool:40m free:5 alloc:pool:90m alloc:mem:784m simused alloc:pool:40m simused \
         alloc:pool:20m simused",
    );
    out.ok();
    for i in 0..8 {
        out.expect(&format!("alloc.{i}"), OK);
    }
    let used = |n| out.nth_num("sim.used.0", n);
    assert_eq!(
        out.val("alloc.8"),
        OOM,
        "no free block of the reserve holds 40m and 20m of the cap are left:{out:?}"
    );
    assert_eq!(used(1), used(0), "the driver grew the pool past the cap:{out:?}");
    assert_eq!(out.val("alloc.9"), OK, "20m fits a free 20m block:{out:?}");
    assert_eq!(used(2), used(1), "the 20m should come from the reserve:{out:?}");
}

/// Allocation sizes are charged as the driver really takes them (rounded to the granularity): 512 pieces
/// of 1 byte take 512 × 2 MiB = 1 GiB, so the 513th fails under a 1 GiB cap.
#[test]
fn small_allocations_charged_at_granularity() {
    let sim = Sim::new().env("CUDASIM_GRANULARITY", "2m").build();
    let out = probe(&sim, "1g", "init fill:mem:1");
    out.ok();
    assert_eq!(out.num("fill.count"), 512, "{out:?}");
    out.expect("fill.rc", OOM);
}

#[test]
fn mem_get_info_reports_the_cap() {
    let sim = Sim::new().memory("16g").build();
    let out = probe(&sim, "1g", "init info totalmem alloc:mem:256m info");
    out.ok();
    out.expect("info.rc", OK).expect("totalmem.rc", OK);
    assert_eq!(out.nth_num("info.total", 0), GIB, "{out:?}");
    assert_eq!(out.nth_num("info.free", 0), GIB, "{out:?}");
    assert_eq!(
        out.num("totalmem"),
        GIB,
        "cuDeviceTotalMem_v2 must report the cap:{out:?}"
    );
    assert_eq!(out.nth_num("info.total", 1), GIB, "{out:?}");
    assert_eq!(out.nth_num("info.free", 1), GIB - 256 * MIB, "{out:?}");
}

/// free = cap − what the whole container uses, other processes included.
#[test]
fn mem_get_info_counts_the_whole_container() {
    let sim = Sim::new().build();
    let mut holder = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:300m wait")
        .spawn();
    holder.wait_ready(1);
    let out = probe(&sim, "1g", "init alloc:mem:100m info");
    out.ok();
    assert_eq!(out.num("info.total"), GIB, "{out:?}");
    assert_eq!(out.num("info.free"), GIB - 400 * MIB, "{out:?}");
    holder.finish().ok();
    // the holder exited (freeing at exit is the driver's business): its share comes back
    let out = probe(&sim, "1g", "init info");
    assert_eq!(
        out.num("info.free"),
        GIB,
        "a finished process still counts:{out:?}"
    );
}

#[test]
fn mem_get_info_null_pointers_do_not_crash() {
    let sim = Sim::new().build();
    let out = probe(&sim, "1g", "init infonull info");
    out.ok();
    for k in ["infonull.free", "infonull.total", "infonull.both"] {
        assert!(out.get(k).is_some(), "{k}:{out:?}");
    }
    assert_eq!(out.num("info.total"), GIB, "{out:?}");
}

/// Without a cap the program sees the whole GPU (the shim is not in the way).
#[test]
fn no_limit_means_the_whole_gpu() {
    let sim = Sim::new().memory("8g").build();
    let out = sim.cmd(Prog::Probe).args("init info totalmem alloc:mem:6g").run();
    out.ok();
    assert_eq!(out.num("info.total"), 8 * GIB, "{out:?}");
    assert_eq!(out.num("totalmem"), 8 * GIB, "{out:?}");
    out.expect("alloc.0", OK);
}

/// cuMemFree of a pointer the shim never saw goes to the driver, which answers with its own error.
#[test]
fn untracked_free_is_passed_through() {
    let sim = Sim::new().build();
    let bare = sim.cmd(Prog::Probe).no_preload().args("init bogusfree").run();
    bare.ok();
    let driver_says = bare.val("bogusfree").to_string();
    assert_ne!(driver_says, OK, "the simulator accepted a bogus free:{bare:?}");
    let out = probe(&sim, "1g", "init bogusfree");
    out.ok();
    assert_eq!(
        out.val("bogusfree"),
        driver_says,
        "the shim must pass the untracked free through:{out:?}"
    );
}
