//! Attacks on elastic memory (issue 39), each beside its control.

use cuquota_core::region::{DeviceSelector, LimitsWriter};
use shim_tests::{Sim, MIB};

/// A 2 GiB device, 1 GiB of it held by a process outside any container until released; the container's limit
/// 1536 MiB, `request` guaranteed.
fn full_device(request: u64) -> (Sim, shim_tests::Proc) {
    let sim = Sim::new().memory("2g").build();
    let w = LimitsWriter::create(&sim.limits_file()).expect("create the limits file");
    w.update(|t| {
        let e = t.entry_mut(DeviceSelector::All)?;
        e.memory_limit = 1536 * MIB;
        e.memory_request = request;
        t.flags |= cuquota_core::region::layout::LIMITS_FLAG_RECLAIM;
        Ok::<_, cuquota_core::region::TableFull>(())
    })
    .expect("limits file busy")
    .expect("limits table full");
    let mut holder = sim
        .cmd(shim_tests::Prog::Probe)
        .no_preload()
        .args("init alloc:mem:1g wait")
        .spawn();
    holder.wait_ready(1);
    assert_eq!(holder.wait_for("alloc.0"), "CUDA_SUCCESS");
    (sim, holder)
}

/// An allocation within the request on a full device waits for the reclaim (the bounded wait) and gets the
/// memory freed meanwhile. Control: an inelastic tenant (request = limit). Case: an elastic tenant, whose
/// large allocation is made movable: it must wait the same (its request is what is guaranteed).
#[test]
fn an_elastic_tenants_allocation_within_its_request_waits_like_any_other() {
    for request in [1536 * MIB, 1280 * MIB] {
        let (sim, mut holder) = full_device(request);
        let waiter = sim
            .cmd(shim_tests::Prog::Probe)
            .env("CUQUOTA_RECLAIM_WAIT_MS", "30000")
            .args("init alloc:mem:1280m")
            .spawn();
        std::thread::sleep(std::time::Duration::from_millis(500));
        holder.release();
        holder.finish().ok();
        let out = waiter.finish();
        out.ok();
        assert_eq!(
            out.val("alloc.0"),
            "CUDA_SUCCESS",
            "request {request}: no wait for the reclaim: {out:?}"
        );
    }
}
