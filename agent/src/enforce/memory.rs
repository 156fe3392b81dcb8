//! `memory = "kill"`: the container's member processes hold more device memory on a GPU than its cap — NVML's
//! figure, the GPU's own, which a process that bypasses the shim cannot hide — for [`GRACE`] consecutive
//! passes: SIGKILL its processes on that GPU, largest first, until what is left fits under the cap.
//!
//! The grace is two samples: one pass sees the container over, the next confirms it, so memory allocated at
//! time t is gone by t + 2 intervals (plus a pass). It keeps a momentary figure (an allocation racing the
//! sample, a limit lowered while the container's processes free memory) from killing anything. A killed
//! process is remembered until it has left the process table, and its memory is not counted meanwhile (it
//! is being released), so one overrun never costs more processes than it takes to fit.

use std::collections::BTreeMap;

use super::super::descriptor::MemoryPolicy;
use super::super::members::ProcTable;
use super::super::report::ContainerReport;
use super::{Action, ActionReport, Decision, Target};
use cuquota_core::units::format_size;

/// Consecutive passes over the cap before the agent acts.
pub const GRACE: u32 = 2;
/// Passes a killed process's memory is left out of the sums while it dies; one still listed after that is
/// counted (and, still over, killed) again.
const DYING_PASSES: u32 = 10;

/// What the agent remembers about one container's memory between passes.
#[derive(Debug, Default)]
pub struct MemoryState {
    /// GPU uuid → consecutive passes over the cap.
    over: BTreeMap<String, u32>,
    /// Processes killed and not gone yet → passes since.
    dying: BTreeMap<Target, u32>,
}

impl MemoryState {
    /// The pass's decision for container `c` (its report just built) under `policy`.
    pub fn plan(&mut self, policy: MemoryPolicy, c: &ContainerReport, table: &ProcTable) -> Decision {
        // Forget killed processes that are gone (or became zombies: their memory is released); keep the rest.
        self.dying.retain(|t, n| {
            *n += 1;
            *n <= DYING_PASSES
                && table
                    .procs
                    .get(&t.pid)
                    .is_some_and(|e| e.start_time == t.start_time && e.state != b'Z')
        });
        let mut out = Decision::default();
        let mut seen = Vec::new();
        for d in &c.devices {
            seen.push(d.uuid.clone());
            let Some(cap) = d.memory_limit_bytes else {
                self.over.remove(&d.uuid);
                continue;
            };
            // The container's processes on this GPU that are not already dying, with their identities.
            let mut live: Vec<(Target, u64)> = d
                .processes
                .iter()
                .filter_map(|p| {
                    let e = table.procs.get(&p.pid)?;
                    let t = Target {
                        pid: p.pid,
                        start_time: e.start_time,
                    };
                    (!self.dying.contains_key(&t) && e.state != b'Z').then_some((t, p.memory_used_bytes))
                })
                .collect();
            let used: u64 = live.iter().map(|x| x.1).sum();
            if used <= cap {
                self.over.remove(&d.uuid);
                continue;
            }
            let n = self.over.entry(d.uuid.clone()).or_default();
            *n += 1;
            let passes = *n;
            if passes < GRACE {
                continue;
            }
            // Largest first; among equals the newest (highest start time).
            live.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.start_time.cmp(&a.0.start_time)));
            let mut left = used;
            let mut victims = Vec::new();
            for (t, bytes) in live {
                if left <= cap {
                    break;
                }
                if bytes == 0 {
                    break; // sorted: nothing left that frees memory
                }
                left -= bytes;
                victims.push(t);
            }
            let why = format!(
                "{} on {} over the cap {} for {passes} passes",
                format_size(used),
                d.uuid,
                format_size(cap)
            );
            match policy {
                MemoryPolicy::Kill if !victims.is_empty() => {
                    for t in &victims {
                        self.dying.insert(*t, 0);
                    }
                    out.actions.push((
                        Action::Kill {
                            targets: victims,
                            device: d.uuid.clone(),
                        },
                        format!("{why}: largest first, until {} fit", format_size(left)),
                    ));
                    self.over.remove(&d.uuid);
                }
                MemoryPolicy::Kill => {}
                MemoryPolicy::Report => out.reports.push(ActionReport::report(
                    victims.iter().map(|t| t.pid).collect(),
                    Some(d.uuid.clone()),
                    format!("{why}: memory = \"report\", would kill these"),
                )),
            }
        }
        self.over.retain(|u, _| seen.contains(u));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::members::ProcEntry;
    use super::*;

    const MIB: u64 = 1 << 20;

    fn table(pids: &[u32]) -> ProcTable {
        let mut t = ProcTable::default();
        for &p in pids {
            t.insert(
                p,
                ProcEntry {
                    ppid: 1,
                    start_time: u64::from(p),
                    state: b'S',
                },
            );
        }
        t
    }

    fn container(cap: Option<u64>, procs: &[(u32, u64)]) -> ContainerReport {
        ContainerReport::on_one_gpu("c", "GPU-0", cap, procs)
    }

    fn killed(d: &Decision) -> Vec<u32> {
        d.actions
            .iter()
            .flat_map(|(a, _)| a.targets().iter().map(|t| t.pid))
            .collect()
    }

    #[test]
    fn kills_after_the_grace_largest_first_until_it_fits() {
        let mut s = MemoryState::default();
        let tb = table(&[10, 11, 12]);
        let c = container(
            Some(1000 * MIB),
            &[(10, 300 * MIB), (11, 600 * MIB), (12, 500 * MIB)],
        );
        assert!(
            killed(&s.plan(MemoryPolicy::Kill, &c, &tb)).is_empty(),
            "first pass over: grace"
        );
        let d = s.plan(MemoryPolicy::Kill, &c, &tb);
        assert_eq!(killed(&d), vec![11], "1400 MiB - 600 MiB fits in 1000 MiB");
        assert!(d.actions[0].1.contains("for 2 passes"), "{}", d.actions[0].1);
        // Next pass: 11 is dying (still listed): its memory is not counted, nothing more dies.
        assert!(killed(&s.plan(MemoryPolicy::Kill, &c, &tb)).is_empty());
        assert!(killed(&s.plan(MemoryPolicy::Kill, &c, &tb)).is_empty());
        // Two at once when one is not enough.
        let mut s = MemoryState::default();
        let c = container(Some(100 * MIB), &[(10, 300 * MIB), (11, 0), (12, 200 * MIB)]);
        s.plan(MemoryPolicy::Kill, &c, &tb);
        assert_eq!(
            killed(&s.plan(MemoryPolicy::Kill, &c, &tb)),
            vec![10, 12],
            "11 holds nothing"
        );
    }

    #[test]
    fn a_dip_under_the_cap_restarts_the_grace_and_no_cap_means_nothing() {
        let mut s = MemoryState::default();
        let tb = table(&[10]);
        let over = container(Some(100 * MIB), &[(10, 200 * MIB)]);
        let under = container(Some(100 * MIB), &[(10, 50 * MIB)]);
        s.plan(MemoryPolicy::Kill, &over, &tb);
        s.plan(MemoryPolicy::Kill, &under, &tb);
        assert!(killed(&s.plan(MemoryPolicy::Kill, &over, &tb)).is_empty());
        assert_eq!(killed(&s.plan(MemoryPolicy::Kill, &over, &tb)), vec![10]);
        let mut s = MemoryState::default();
        let none = container(None, &[(10, 200 * MIB)]);
        for _ in 0..3 {
            assert!(killed(&s.plan(MemoryPolicy::Kill, &none, &tb)).is_empty());
        }
    }

    #[test]
    fn report_records_what_it_would_kill_and_kills_nothing() {
        let mut s = MemoryState::default();
        let tb = table(&[10, 11]);
        let c = container(Some(100 * MIB), &[(10, 200 * MIB), (11, 20 * MIB)]);
        assert!(s.plan(MemoryPolicy::Report, &c, &tb).reports.is_empty(), "grace");
        for _ in 0..3 {
            let d = s.plan(MemoryPolicy::Report, &c, &tb);
            assert!(d.actions.is_empty());
            assert_eq!(d.reports.len(), 1);
            assert_eq!(d.reports[0].pids, vec![10]);
            assert_eq!(d.reports[0].action, "report");
            assert!(d.reports[0].detail.as_deref().unwrap().contains("would kill"));
        }
    }

    #[test]
    fn gone_and_reused_pids_are_not_targets() {
        let mut s = MemoryState::default();
        let c = container(Some(100 * MIB), &[(10, 200 * MIB), (11, 150 * MIB)]);
        let mut tb = table(&[11]); // 10 is no longer in /proc
        s.plan(MemoryPolicy::Kill, &c, &tb);
        let d = s.plan(MemoryPolicy::Kill, &c, &tb);
        assert_eq!(killed(&d), vec![11]);
        assert_eq!(
            d.actions[0].0.targets()[0].start_time,
            11,
            "its identity from /proc"
        );
        // A zombie holds nothing.
        tb.procs.get_mut(&11).unwrap().state = b'Z';
        let mut s = MemoryState::default();
        s.plan(MemoryPolicy::Kill, &c, &tb);
        assert!(killed(&s.plan(MemoryPolicy::Kill, &c, &tb)).is_empty());
    }
}
