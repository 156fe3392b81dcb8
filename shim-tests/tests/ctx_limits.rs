//! #11 class 2, memory the driver reserves on request: `cuCtxSetLimit` of the stack size (per thread, for every
//! thread the device can hold), the printf FIFO and the malloc heap reserves device memory that no allocation call
//! shows. The attack (`probe setlimit:heap:2g` under a 1 GiB cap) took 2 GiB of the simulated GPU — by the
//! simulator's own per-process NVML figure, the ground truth — while the container's cap was 1 GiB. The shim now
//! admits the growth against the cap first (`CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked) and charges it, so
//! it shows in `cuMemGetInfo` and leaves that much less for allocations.

use shim_tests::{probe, Prog, Sim, MIB};

/// Issue 21: the device runtime's pending-launch buffer (`CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`) is
/// reserved by the driver too (2 KiB a launch on the simulator, a cost the shim does not know in advance): a
/// million pending launches took 2 GiB under a 1 GiB cap. The raised limit is measured, and set back and
/// refused when its reservation does not fit; a smaller one (64 Ki launches, 124 MiB over the default) is
/// charged and shown.
#[test]
fn a_pending_launch_buffer_over_the_cap_is_set_back_and_refused() {
    let sim = Sim::new().build();
    let out = probe(
        &sim,
        "1g",
        "init info setlimit:pending:1m getlimit:pending simused info setlimit:pending:64k getlimit:pending info simused",
    );
    out.ok();
    for u in out.all("sim.used.0") {
        let u: u64 = u.parse().unwrap();
        assert!(
            u <= 1024 * MIB,
            "the simulated GPU holds {} MiB under a 1 GiB cap:{out:?}",
            u / MIB
        );
    }
    out.expect("setlimit.pending", OK);
    assert_eq!(out.all("setlimit.pending")[0], OOM, "{out:?}");
    assert_eq!(out.all("getlimit.pending"), vec!["2048", "65536"], "{out:?}");
    let free: Vec<u64> = (0..3).map(|i| out.nth_num("info.free", i)).collect();
    assert_eq!(free[0], free[1], "the refused limit stays charged: {free:?}");
    assert_eq!(
        free[1] - free[2],
        (65536 - 2048) * 2048,
        "the raised limit is not charged: {free:?}"
    );

    // Without NVML the reservation cannot be measured: under a cap the raise is set back (fail closed).
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .env("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1")
        .args("init setlimit:pending:64k getlimit:pending simused")
        .run();
    out.ok();
    out.expect("setlimit.pending", OOM)
        .expect("getlimit.pending", "2048");
    assert_eq!(out.num("sim.used.0"), 0, "{out:?}");
}

const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const OK: &str = "CUDA_SUCCESS";

#[test]
fn a_malloc_heap_over_the_cap_is_refused_and_the_gpu_never_holds_it() {
    let sim = Sim::new().build();
    let out = probe(&sim, "1g", "init setlimit:heap:2g getlimit:heap simused");
    out.ok();
    let used = out.num("sim.used.0");
    assert!(
        used <= 1024 * MIB,
        "the simulated GPU holds {} MiB for a process under a 1 GiB cap:{out:?}",
        used / MIB
    );
    out.expect("setlimit.heap", OOM);
    // The driver was not asked: the heap keeps its default (8 MiB on the simulator).
    out.expect("getlimit.heap", &(8 * MIB).to_string());
}

#[test]
fn a_stack_size_for_every_resident_thread_over_the_cap_is_refused() {
    // 16 SMs × 2048 threads × 64 KiB = 2 GiB.
    let sim = Sim::new().sms("16").build();
    let out = probe(&sim, "1g", "init setlimit:stack:64k simused");
    out.ok();
    out.expect("setlimit.stack", OOM);
    assert!(out.num("sim.used.0") <= 1024 * MIB, "{out:?}");
}

#[test]
fn reservations_under_the_cap_are_charged_shown_and_given_back() {
    let sim = Sim::new().sms("16").build();
    // Heap 8 → 264 MiB: +256 MiB; stack 1 → 9 KiB per thread × 32768 threads: +256 MiB; FIFO 1 → 65 MiB: +64 MiB.
    let out = probe(
        &sim,
        "1g",
        "init info setlimit:heap:264m info setlimit:stack:9k setlimit:fifo:65m info alloc:mem:512m \
         setlimit:heap:8m setlimit:stack:1k setlimit:fifo:1m info alloc:mem:512m simused",
    );
    out.ok();
    let free: Vec<u64> = (0..4).map(|i| out.nth_num("info.free", i)).collect();
    assert_eq!(free[0] - free[1], 256 * MIB, "heap not charged: {free:?}");
    assert_eq!(
        free[1] - free[2],
        320 * MIB,
        "stack and FIFO not charged: {free:?}"
    );
    out.expect("setlimit.heap", OK).expect("setlimit.stack", OK);
    // 576 MiB reserved: 512 MiB more does not fit under 1 GiB; once the limits are lowered it does.
    assert_eq!(out.all("alloc.0"), vec![OOM], "{out:?}");
    assert_eq!(free[3], free[0], "lowered limits not given back: {free:?}");
    out.expect("alloc.1", OK);
    assert!(out.num("sim.used.0") <= 1024 * MIB, "{out:?}");
}

#[test]
fn a_released_context_takes_its_reservation_with_it() {
    let sim = Sim::new().build();
    let out = probe(
        &sim,
        "1g",
        "init setlimit:heap:264m simused info release simused dev:0 getlimit:heap info simused",
    );
    out.ok();
    let used: Vec<u64> = (0..3).map(|i| out.nth_num("sim.used.0", i)).collect();
    assert_eq!(used, vec![256 * MIB, 0, 0], "the simulator's count: {out:?}");
    out.expect("release", OK)
        .expect("getlimit.heap", &(8 * MIB).to_string());
    assert_eq!(out.nth_num("info.free", 0), 768 * MIB, "{out:?}");
    assert_eq!(out.nth_num("info.free", 1), 1024 * MIB, "not given back: {out:?}");
}
