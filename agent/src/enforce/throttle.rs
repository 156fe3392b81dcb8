//! `sm = "throttle"`: a container whose measured device time on a GPU runs past its SM limit is frozen — its
//! cgroup's freezer when its members are a cgroup, else SIGSTOP/SIGCONT of every member — until it has repaid
//! what it took, and killed where freezing cannot hold it.
//!
//! **A debt of device time.** Per GPU the container has a balance in seconds of device time: each pass adds
//! what NVML measured for its member processes over the interval (per-process utilisation × the time since
//! the last pass: the GPU's own figure, which counts the kernels a frozen process had queued before it was
//! stopped) and subtracts what its limit `L` allowed in that time. Credit is capped at [`credit`] — `(1 − L)`
//! of an interval, so a container under its limit runs whole intervals untouched (and a cooperative
//! container held by the shim is never frozen) — and a debt is carried until repaid, across freezes, kills
//! and restarts (per GPU UUID while the container exists, also while none of its processes holds the GPU).
//!
//! **Freeze.** Each pass plans, assuming the container runs flat out while thawed (the worst case), how long
//! it must stay frozen from now ([`freeze_needed`]): within an interval it may run `L × interval − debt`;
//! a debt larger than that keeps it frozen for `debt / L`, the time the limit takes to repay it. A container
//! frozen at the pass stays frozen (its thaw is moved), so it gets no instant to queue more work. The next
//! pass measures again: the work that ran while frozen (queued kernels) is in the balance, and so on. So the
//! average share over a window is the limit within (debt bound + credit) / window.
//!
//! **Escalation.** Freezing stops a process from submitting; the GPU still runs what it queued (up to 1 024
//! kernels a stream on the simulator, more on a GPU). A container that was frozen for at least half of the
//! last interval and is still more than [`ESCALATE_DEBT`] in debt is not held by freezing: its member
//! processes that ran on that GPU in the interval are SIGKILLed (the driver drops a dead process's queued
//! work). The grace is the debt bound: no container gets more than `ESCALATE_DEBT` plus one interval past
//! its limit ([`COOPERATIVE_ESCALATE_DEBT`] where every process that ran holds a live usage-file slot).
//! A freeze still on is applied again at every pass (a member may have continued the others).
//!
//! **When.** Under a `burst` or `default` policy (work-conserving, as in the shim) a container is held to its
//! limit only while another process used the same GPU in the interval; alone, it is charged at most its
//! limit and never frozen for that GPU. When NVML has no utilisation for the GPU (e.g. MIG), the balance
//! stays as it was. Over several GPUs the longest freeze decides.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::super::descriptor::SmPolicy;
use super::super::members::ProcTable;
use super::super::report::{ContainerReport, GpuSample};
use super::{Action, ActionReport, Decision, Target};

/// Debt (device seconds past the limit) at which a container that freezing did not stop is killed.
pub const ESCALATE_DEBT: f64 = 1.0;
/// The same where every process that ran on the GPU holds a live slot in the container's usage file (the shim
/// is loaded: it throttles at launch, but cannot split a kernel, so one long kernel runs on while the process
/// is frozen). A tenant that forges a slot gains at most this much device time past its limit before the
/// kill, once while its debt lasts (the debt outlives the kill): it stays bounded.
pub const COOPERATIVE_ESCALATE_DEBT: f64 = 10.0;
/// A freeze shorter than this is not worth a signal.
const MIN_FREEZE: Duration = Duration::from_millis(1);

/// The credit a container under limit `l` (0–1) may bank, in device seconds: `(1 − l)` of an interval.
pub fn credit(l: f64, interval: Duration) -> f64 {
    (1.0 - l).max(0.0) * interval.as_secs_f64()
}

/// One GPU of the container, as the controller sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceShare {
    /// `GPU-…`.
    pub uuid: String,
    /// The container's measured share over the last interval, percent (None: NVML could not say).
    pub util: Option<f64>,
    /// Its SM limit, percent.
    pub limit: Option<u32>,
    /// `burst` / `default`: held to the limit only while others use the GPU.
    pub work_conserving: bool,
    /// Some process outside the container ran kernels on the GPU in the interval.
    pub others_busy: bool,
}

/// The new balance (device seconds, positive = debt) after `elapsed` at share `s`.
pub fn next_balance(balance: f64, s: &DeviceShare, elapsed: Duration, interval: Duration) -> f64 {
    let Some(limit) = s.limit else { return balance };
    let l = f64::from(limit) / 100.0;
    let Some(u) = s.util else { return balance };
    let mut used = (u / 100.0).clamp(0.0, 1.0);
    if s.work_conserving && !s.others_busy {
        used = used.min(l); // alone under a work-conserving policy: never in debt for it
    }
    (balance + (used - l) * elapsed.as_secs_f64()).max(-credit(l, interval))
}

/// How long a container `balance` seconds in debt under limit `l` (0–1) must stay frozen from now, assuming it
/// runs flat out while thawed: within the next interval it may run `l × interval − balance`; past that, the
/// debt is repaid at rate `l` while frozen.
pub fn freeze_needed(balance: f64, l: f64, interval: Duration) -> Duration {
    let i = interval.as_secs_f64();
    let secs = if balance <= l * i {
        (1.0 - l) * i + balance
    } else {
        balance / l.max(1e-3)
    };
    Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
}

/// The container's processes frozen now, and when to thaw them.
#[derive(Debug)]
pub struct Frozen {
    /// What was frozen (the thaw undoes exactly this).
    pub targets: Vec<Target>,
    /// The cgroup frozen, when the freezer was used.
    pub cgroup: Option<PathBuf>,
    /// When (the time frozen is counted from here, moved at each pass).
    pub since: Instant,
    /// When to thaw.
    pub thaw_at: Instant,
}

/// What the agent remembers about one container's SM share between passes.
#[derive(Debug, Default)]
pub struct ThrottleState {
    /// Per GPU (by UUID): the balance in device seconds (positive = debt) and the limit it was charged under.
    /// Kept while the container exists, also for a GPU none of its processes holds now (a killed tenant that
    /// starts again finds its debt), repaid at the limit meanwhile and dropped once back at full credit.
    balances: BTreeMap<String, (f64, u32)>,
    /// Held now: some GPU's balance is past half its credit (logged when it ends).
    pub engaged: bool,
    last_pass: Option<Instant>,
    /// Time frozen since the last pass.
    frozen_for: Duration,
    /// Frozen now.
    pub frozen: Option<Frozen>,
    /// Whether the first pass (recovering from an earlier agent's freeze) is done.
    recovered: bool,
}

/// The container's processes the agent may freeze: every member except zombies, processes someone else
/// stopped (their stop is not ours to undo), and the agent itself.
pub fn freezable(members: &BTreeSet<u32>, table: &ProcTable) -> Vec<Target> {
    let me = std::process::id();
    members
        .iter()
        .filter(|&&p| p != me)
        .filter_map(|&pid| {
            let e = table.procs.get(&pid)?;
            (e.state != b'Z' && e.state != b'T').then_some(Target {
                pid,
                start_time: e.start_time,
            })
        })
        .collect()
}

/// Whether the cgroup `dir` is frozen now (v2 `cgroup.freeze`, v1 `freezer.state`).
pub fn cgroup_frozen(dir: &Path) -> bool {
    if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.freeze")) {
        return s.trim() == "1";
    }
    super::actuator::v1_freezer(dir)
        .and_then(|f| std::fs::read_to_string(f).ok())
        .is_some_and(|s| s.trim() != "THAWED")
}

impl ThrottleState {
    /// On the first pass that sees a container under `sm = "throttle"`, undo a freeze an earlier run of the
    /// agent may have left (it was killed while the container was frozen): a frozen cgroup is thawed;
    /// without one, members stopped (state T) are continued. The agent owns the freezer of a throttled
    /// container: do not pause such a container by other means.
    pub fn recover(
        &mut self,
        members: &BTreeSet<u32>,
        table: &ProcTable,
        cgroup: Option<&Path>,
    ) -> Option<(Action, String)> {
        if std::mem::replace(&mut self.recovered, true) {
            return None;
        }
        if let Some(dir) = cgroup.filter(|d| super::actuator::has_freezer(d)) {
            return cgroup_frozen(dir).then(|| {
                (
                    Action::Thaw {
                        targets: freezable(members, table),
                        cgroup: Some(dir.to_path_buf()),
                    },
                    "found frozen when the agent started (an earlier run stopped while it was frozen)".into(),
                )
            });
        }
        let stopped: Vec<Target> = members
            .iter()
            .filter_map(|&pid| {
                let e = table.procs.get(&pid)?;
                (e.state == b'T').then_some(Target {
                    pid,
                    start_time: e.start_time,
                })
            })
            .collect();
        (!stopped.is_empty()).then(|| {
            (
                Action::Thaw {
                    targets: stopped,
                    cgroup: None,
                },
                "found stopped when the agent started (an earlier run stopped while they were frozen)".into(),
            )
        })
    }

    /// The pass's decision for container `c` at `now`: charges the interval's measured device time to each
    /// GPU's balance, and under `throttle` freezes the container for as long as its debt needs (keeping a
    /// freeze still on, recorded in [`ThrottleState::frozen`]; the caller thaws it at `thaw_at`), or kills
    /// the members that ran where freezing did not hold it.
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &mut self,
        policy: SmPolicy,
        c: &ContainerReport,
        gpus: &[GpuSample],
        members: &BTreeSet<u32>,
        cooperative: &BTreeSet<u32>,
        table: &ProcTable,
        cgroup: Option<&Path>,
        interval: Duration,
        now: Instant,
    ) -> Decision {
        let elapsed = self.last_pass.map_or(interval, |t| now.duration_since(t));
        self.last_pass = Some(now);
        if let Some(f) = self.frozen.as_mut() {
            self.frozen_for += now.saturating_duration_since(f.since);
            f.since = now;
        }
        let frozen_for = std::mem::take(&mut self.frozen_for);
        let mostly_frozen = frozen_for * 2 >= elapsed && !elapsed.is_zero();
        let mut out = Decision::default();
        // The longest freeze any GPU needs, with the GPU, its share, limit and balance.
        let mut need: Option<(Duration, String, f64, u32, f64)> = None;
        let mut engaged = false;
        // A GPU none of its processes holds now: nothing ran there, the debt is repaid at the limit (unless
        // NVML has no figure for the GPU: then it stays as it was).
        for (uuid, (b, limit)) in self.balances.iter_mut() {
            if c.devices.iter().any(|d| &d.uuid == uuid) {
                continue;
            }
            let measured = gpus
                .iter()
                .find(|g| &g.gpu.uuid == uuid)
                .is_some_and(|g| g.utilization.is_some());
            let s = DeviceShare {
                uuid: uuid.clone(),
                util: measured.then_some(0.0),
                limit: Some(*limit),
                work_conserving: false,
                others_busy: false,
            };
            *b = next_balance(*b, &s, elapsed, interval);
        }
        self.balances.retain(|u, (b, limit)| {
            c.devices.iter().any(|d| &d.uuid == u) || *b > -credit(f64::from(*limit) / 100.0, interval)
        });
        for d in &c.devices {
            let Some(limit) = d.sm_limit_percent else {
                self.balances.remove(&d.uuid);
                continue;
            };
            let s = DeviceShare {
                uuid: d.uuid.clone(),
                util: d.utilization_percent,
                limit: Some(limit),
                work_conserving: d.policy != "hard",
                others_busy: gpus
                    .iter()
                    .find(|g| g.gpu.uuid == d.uuid)
                    .and_then(|g| g.utilization.as_ref())
                    .is_some_and(|u| u.iter().any(|(pid, s)| !members.contains(pid) && *s > 0.0)),
            };
            let l = f64::from(limit) / 100.0;
            let (b, lim) = self
                .balances
                .entry(d.uuid.clone())
                .or_insert_with(|| (-credit(l, interval), limit));
            *b = next_balance(*b, &s, elapsed, interval);
            *lim = limit;
            let b = *b;
            engaged |= b > -credit(l, interval) / 2.0;
            if s.work_conserving && !s.others_busy {
                continue;
            }
            let util = d.utilization_percent.unwrap_or(0.0);
            let ran_pids: Vec<u32> = d
                .processes
                .iter()
                .filter(|p| p.sm_util_percent.is_some_and(|u| u > 0.0))
                .map(|p| p.pid)
                .collect();
            let grace = if !ran_pids.is_empty() && ran_pids.iter().all(|p| cooperative.contains(p)) {
                COOPERATIVE_ESCALATE_DEBT
            } else {
                ESCALATE_DEBT
            };
            if b > grace && mostly_frozen && util > f64::from(limit) {
                let ran: Vec<Target> = d
                    .processes
                    .iter()
                    .filter(|p| p.sm_util_percent.is_some_and(|u| u > 0.0))
                    .filter_map(|p| {
                        let e = table.procs.get(&p.pid)?;
                        (e.state != b'Z').then_some(Target {
                            pid: p.pid,
                            start_time: e.start_time,
                        })
                    })
                    .collect();
                let why = format!(
                    "{util:.1} % of {} while frozen {} ms of the last {} ms, {b:.2} s of device time past a \
                     limit of {limit} % (more than {grace} s): freezing does not hold it",
                    d.uuid,
                    frozen_for.as_millis(),
                    elapsed.as_millis()
                );
                match policy {
                    SmPolicy::Throttle if !ran.is_empty() => out.actions.push((
                        Action::Kill {
                            targets: ran,
                            device: d.uuid.clone(),
                        },
                        format!("{why} (SIGKILL of the processes that ran on it)"),
                    )),
                    SmPolicy::Throttle => {}
                    SmPolicy::Report => out.reports.push(ActionReport::report(
                        ran.iter().map(|t| t.pid).collect(),
                        Some(d.uuid.clone()),
                        format!(
                            "{why}: sm = \"report\", would kill {:?}",
                            ran.iter().map(|t| t.pid).collect::<Vec<_>>()
                        ),
                    )),
                }
            }
            let n = freeze_needed(b, l, interval);
            if n >= MIN_FREEZE && need.as_ref().is_none_or(|x| n > x.0) {
                need = Some((n, d.uuid.clone(), util, limit, b));
            }
        }
        self.engaged = engaged || need.is_some();
        let Some((freeze, uuid, util, limit, b)) = need else {
            // Nothing owed: a freeze still on ends now (the caller's thaw is due).
            if let Some(f) = self.frozen.as_mut() {
                f.thaw_at = now;
            }
            return out;
        };
        let why = format!(
            "{util:.1} % of {uuid} over the last {} ms against a limit of {limit} %, balance {b:+.3} s of device time",
            elapsed.as_millis(),
        );
        let targets = freezable(members, table);
        match policy {
            SmPolicy::Throttle => {
                // Already frozen: the freeze goes on (no instant to queue more), new members join it, and it
                // is applied again to every process it holds (SIGSTOP is idempotent): a member may have
                // continued the others meanwhile (one forked after the pass read /proc is not in the freeze).
                let again = self.frozen.is_some();
                let (held, since) = match self.frozen.take() {
                    Some(f) => (f.targets, f.since),
                    None => (Vec::new(), now),
                };
                let mut held: Vec<Target> = held
                    .into_iter()
                    .filter(|h| {
                        members.contains(&h.pid)
                            && table
                                .procs
                                .get(&h.pid)
                                .is_some_and(|e| e.start_time == h.start_time && e.state != b'Z')
                    })
                    .collect();
                let fresh: Vec<Target> = targets
                    .into_iter()
                    .filter(|t| !held.iter().any(|h| h.pid == t.pid))
                    .collect();
                held.extend(fresh);
                let cgroup = cgroup.map(Path::to_path_buf);
                if !held.is_empty() {
                    out.actions.push((
                        Action::Freeze {
                            targets: held.clone(),
                            cgroup: cgroup.clone(),
                        },
                        format!(
                            "{why}: frozen for {} ms{}",
                            freeze.as_millis(),
                            if again {
                                " (a freeze still on, applied again)"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                if !held.is_empty() {
                    self.frozen = Some(Frozen {
                        targets: held,
                        cgroup,
                        since,
                        thaw_at: now + freeze,
                    });
                }
            }
            SmPolicy::Report => out.reports.push(ActionReport::report(
                targets.iter().map(|t| t.pid).collect(),
                Some(uuid),
                format!("{why}: sm = \"report\", would freeze {} ms", freeze.as_millis()),
            )),
        }
        out
    }

    /// When the frozen container is due to be thawed.
    pub fn thaw_due(&self) -> Option<Instant> {
        self.frozen.as_ref().map(|f| f.thaw_at)
    }

    /// Thaws now (due, or the container is going away): the action that undoes the freeze, and the processes
    /// it may touch (those the freeze named).
    pub fn thaw(&mut self, now: Instant, why: &str) -> Option<(Action, String, BTreeSet<u32>)> {
        let f = self.frozen.take()?;
        let held = now.saturating_duration_since(f.since);
        self.frozen_for += held;
        let allowed = f.targets.iter().map(|t| t.pid).collect();
        Some((
            Action::Thaw {
                targets: f.targets,
                cgroup: f.cgroup,
            },
            format!("{why} after {} ms frozen", held.as_millis()),
            allowed,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_millis(200);

    fn share(util: Option<f64>, limit: u32) -> DeviceShare {
        DeviceShare {
            uuid: "GPU-0".into(),
            util,
            limit: Some(limit),
            work_conserving: false,
            others_busy: false,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn under_its_limit_a_container_banks_credit_and_is_never_frozen() {
        let c = credit(0.3, I);
        assert!(close(c, 0.14), "{c}");
        // 20 % under a 30 % limit: the balance stays at the credit cap, no freeze.
        let b = next_balance(-c, &share(Some(20.0), 30), I, I);
        assert!(close(b, -c), "{b}");
        assert_eq!(freeze_needed(b, 0.3, I), Duration::ZERO);
    }

    #[test]
    fn flat_out_it_runs_its_limit_of_each_interval() {
        // From full credit, one flat-out interval: the balance is 0, the next interval runs 30 %.
        let b = next_balance(-credit(0.3, I), &share(Some(100.0), 30), I, I);
        assert!(close(b, 0.0), "{b}");
        assert_eq!(freeze_needed(b, 0.3, I), Duration::from_millis(140));
        // Work queued before a freeze ran on: the debt keeps it frozen past the interval, repaid at the limit.
        let b = 0.3;
        assert!(close(freeze_needed(b, 0.3, I).as_secs_f64(), 1.0));
        let b = next_balance(b, &share(Some(0.0), 30), Duration::from_secs(1), I);
        assert!(close(b, 0.0), "{b}");
    }

    #[test]
    fn no_figure_keeps_the_balance_and_no_limit_owes_nothing() {
        assert!(close(next_balance(0.5, &share(None, 30), I, I), 0.5));
        let mut s = share(Some(100.0), 30);
        s.limit = None;
        assert!(close(next_balance(0.5, &s, I, I), 0.5));
    }

    #[test]
    fn work_conserving_policies_owe_only_when_others_want_the_gpu() {
        let mut s = share(Some(100.0), 30);
        s.work_conserving = true;
        let b = next_balance(0.0, &s, I, I);
        assert!(close(b, 0.0), "alone: charged at most the limit: {b}");
        s.others_busy = true;
        assert!(close(next_balance(0.0, &s, I, I), 0.14));
    }
}
