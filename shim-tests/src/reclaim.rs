//! Fixtures of elastic memory and the agent's reclaim (issue 39): the limits file as the agent writes it, a
//! device another process fills, and the allocation that waits for the reclaim.

use crate::{Cmd, Output, Proc, Prog, Sim};
use cuquota_core::region::layout::LIMITS_FLAG_RECLAIM;
use cuquota_core::region::{DeviceSelector, LimitsWriter, TableFull};
use std::path::Path;

/// The agent writes limits file `file` (created if needed): the `all` entry's memory `limit` and `request`,
/// and asks that entry to evict (its `evict_mask` bit) when `evict`, clears the ask otherwise.
pub fn elastic_limits(file: &Path, limit: u64, request: u64, evict: bool) {
    let w = LimitsWriter::create(file).expect("create the limits file");
    w.update(|t| {
        let e = t.entry_mut(DeviceSelector::All)?;
        e.memory_limit = limit;
        e.memory_request = request;
        let i = t
            .entries
            .iter()
            .position(|e| e.is_valid() && e.selector() == DeviceSelector::All)
            .expect("the all entry");
        t.evict_mask = if evict { 1 << i } else { 0 };
        Ok::<_, TableFull>(())
    })
    .expect("limits file busy")
    .expect("limits table full");
}

/// The agent of limits file `file` says it reclaims (`LIMITS_FLAG_RECLAIM`: allocations may wait for it).
pub fn agent_reclaims(file: &Path) {
    LimitsWriter::open(file)
        .expect("open the limits file")
        .update(|t| {
            t.flags |= LIMITS_FLAG_RECLAIM;
            Ok::<_, std::convert::Infallible>(())
        })
        .expect("limits file busy")
        .expect("infallible");
}

/// A process outside any container (no shim) holding `size` (`"1g"`) of the device until released.
pub fn hold_outside(sim: &Sim, size: &str) -> Proc {
    let mut holder = sim
        .cmd(Prog::Probe)
        .no_preload()
        .args(&format!("init alloc:mem:{size} wait"))
        .spawn();
    holder.wait_ready(1);
    assert_eq!(
        holder.wait_for("alloc.0"),
        "CUDA_SUCCESS",
        "the holder's allocation"
    );
    holder
}

/// Frees what a holder of [`hold_outside`] holds: it ends, cleanly.
#[track_caller]
pub fn free_held(mut holder: Proc) {
    holder.release();
    holder.finish().ok();
}

/// Frees what `holder` holds, then collects `waiter` (of [`waiter`]), which must end cleanly.
#[track_caller]
pub fn free_held_then_collect(holder: Proc, waiter: Proc) -> Output {
    free_held(holder);
    let out = waiter.finish();
    out.ok();
    out
}

/// An allocation of 1280 MiB that waits up to `wait_ms` (`CUQUOTA_RECLAIM_WAIT_MS`) for the reclaim.
pub fn waiter<'a>(sim: &'a Sim, wait_ms: &str) -> Cmd<'a> {
    sim.cmd(Prog::Probe)
        .env("CUQUOTA_RECLAIM_WAIT_MS", wait_ms)
        .args("init alloc:mem:1280m")
}
