//! What the hostile reviews of the allocation credit (tests/credit_over_cap.rs, credit_usage_file.rs) share: their
//! program (`c/credit_holder.c`), the simulator's own figure, a program started and waited for, and a
//! holder's step measured beside another program.

use crate::{compile_c, workspace_root, Output, Proc, Prog, Sim};
use std::path::PathBuf;
use std::time::Duration;

/// `c/credit_holder.c`, built.
pub fn prog() -> PathBuf {
    compile_c(
        "credit_holder",
        &workspace_root().join("shim-tests/c/credit_holder.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

/// The simulator's own used bytes of device 0.
pub fn sim_used(sim: &Sim) -> u64 {
    let raw = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    raw.ok();
    raw.num("sim.used.0")
}

/// `credit_holder ARGS` under a 1 GiB cap, once it said it is ready.
pub fn started(sim: &Sim, args: &str) -> Proc {
    let mut p = sim
        .cmd_path(prog())
        .mem_limit("1g")
        .args(args)
        .timeout(Duration::from_secs(60))
        .spawn();
    p.wait_ready(1);
    p
}

/// The holder's next step beside `other` (both started): the simulator's used bytes before and after it, then
/// both let go and finished (the holder's output, the other's).
pub fn holder_step(sim: &Sim, mut holder: Proc, mut other: Proc) -> (u64, u64, Output, Output) {
    let before = sim_used(sim);
    holder.release();
    holder.wait_ready(2);
    let after = sim_used(sim);
    holder.release();
    other.release();
    (before, after, holder.finish(), other.finish())
}
