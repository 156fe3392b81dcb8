//! `sm = "throttle"`: a container whose measured share of a GPU runs over its SM limit is frozen for part of
//! every interval — its cgroup's freezer when its members are a cgroup, else SIGSTOP/SIGCONT of every member —
//! so that its average share comes back to the limit.
//!
//! **Duty cycle.** Each pass plans a run fraction `p` for the interval that starts: the container is frozen
//! at once for `(1 − p) × interval` and thawed, then runs until the next pass. The duty period is the
//! interval (`--interval`, default 1 s): a shorter interval gives finer, more frequent freezes.
//!
//! **Controller.** From the last interval the pass knows the share `u` NVML measured for the container and
//! the fraction `p_applied` of the interval it was really left running (timed by the agent). With a demand
//! of `r` while running, `u = p_applied × r`; the share is `L` at `p = L / r`, so
//! `p = p_applied × L / u` (one step for a steady demand), with the step bounded to ×1/10…×4 per pass (a
//! burst of noise cannot swing it further) and `p ≥ 1 %`. Work already queued when the freeze starts still runs
//! (a frozen process stops submitting, the GPU finishes what it has): that spill shows up in `u`, and the
//! same update lowers `p` until the average is `L`. Over several devices, the strictest device decides.
//!
//! **When.** An unthrottled container is throttled when its share in an interval exceeds the limit by more
//! than [`ENGAGE_MARGIN`] points (NVML's per-process figure is sampled; a cooperative container held by
//! the shim stays within about 2 points); once engaged the controller holds the average at the limit, and
//! lets go when `p` reaches 1. Under a `burst` or `default` policy (work-conserving, as in the shim) the
//! container is only held to its limit while another process used the same GPU in the interval. When NVML
//! has no utilisation for the GPU (e.g. MIG), `p` stays as it is.
//!
//! **Delay.** A container that starts running flat out at time t is frozen by the first pass after t whose
//! interval shows it over the limit by more than the margin (the first, or the second when the first saw only
//! the tail of an interval of work); the interval after that freeze is at about the limit: back at the limit
//! within 3 intervals of t (docs/agent.md has the measured figures).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::super::descriptor::SmPolicy;
use super::super::members::ProcTable;
use super::super::report::{ContainerReport, GpuSample};
use super::{Action, ActionReport, Decision, Target};

/// Largest factor by which the run fraction falls in one pass (a limit of 10 % or more is reached in one).
const DOWN_STEP: f64 = 10.0;
/// Largest factor by which it rises in one pass.
const UP_STEP: f64 = 4.0;
/// Smallest run fraction: a container is never frozen for more than 99 % of an interval.
pub const P_MIN: f64 = 0.01;
/// Points over the limit in one interval before an unthrottled container is throttled.
pub const ENGAGE_MARGIN: f64 = 5.0;

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

/// The controller: the run fraction for the next interval, and the device that set it.
pub fn next_run_fraction(
    p_applied: f64,
    engaged: bool,
    shares: &[DeviceShare],
) -> (f64, Option<&DeviceShare>) {
    let mut p = 1.0;
    let mut by = None;
    for s in shares {
        let Some(limit) = s.limit else { continue };
        let limit = f64::from(limit);
        let candidate = match s.util {
            None if engaged => p_applied,
            None => continue,
            Some(_) if s.work_conserving && !s.others_busy => continue,
            Some(u) if !engaged && u <= limit + ENGAGE_MARGIN => continue,
            Some(u) if u <= 0.0 => p_applied * UP_STEP,
            Some(u) => p_applied * (limit / u).clamp(1.0 / DOWN_STEP, UP_STEP),
        };
        if candidate < p {
            p = candidate;
            by = Some(s);
        }
    }
    (p.clamp(P_MIN, 1.0), by)
}

/// The container's processes frozen now, and when to thaw them.
pub struct Frozen {
    /// What was frozen (the thaw undoes exactly this).
    pub targets: Vec<Target>,
    /// The cgroup frozen, when the freezer was used.
    pub cgroup: Option<PathBuf>,
    /// When.
    pub since: Instant,
    /// When to thaw.
    pub thaw_at: Instant,
}

/// What the agent remembers about one container's SM share between passes.
#[derive(Default)]
pub struct ThrottleState {
    /// Run fraction planned for the current interval.
    run: Option<f64>,
    /// Throttling now (p < 1 at the last pass).
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

    /// The pass's decision for container `c` at `now`: measures the run fraction the last interval had, runs
    /// the controller, and under `throttle` freezes the container (recording the freeze in
    /// [`ThrottleState::frozen`]; the caller thaws it at `thaw_at`).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &mut self,
        policy: SmPolicy,
        c: &ContainerReport,
        gpus: &[GpuSample],
        members: &BTreeSet<u32>,
        table: &ProcTable,
        cgroup: Option<&Path>,
        interval: Duration,
        now: Instant,
    ) -> Decision {
        let elapsed = self.last_pass.map_or(interval, |t| now.duration_since(t));
        self.last_pass = Some(now);
        let frozen_for = std::mem::take(&mut self.frozen_for);
        let p_applied = if policy == SmPolicy::Throttle && self.run.is_some() && !elapsed.is_zero() {
            (1.0 - frozen_for.as_secs_f64() / elapsed.as_secs_f64()).clamp(0.0, 1.0)
        } else {
            1.0 // report: nothing was ever frozen
        };
        let shares: Vec<DeviceShare> = c
            .devices
            .iter()
            .map(|d| DeviceShare {
                uuid: d.uuid.clone(),
                util: d.utilization_percent,
                limit: d.sm_limit_percent,
                work_conserving: d.policy != "hard",
                others_busy: gpus
                    .iter()
                    .find(|g| g.gpu.uuid == d.uuid)
                    .and_then(|g| g.utilization.as_ref())
                    .is_some_and(|u| u.iter().any(|(pid, s)| !members.contains(pid) && *s > 0.0)),
            })
            .collect();
        let (p, by) = next_run_fraction(p_applied, policy == SmPolicy::Throttle && self.engaged, &shares);
        let mut out = Decision::default();
        self.engaged = p < 1.0;
        self.run = Some(p);
        let Some(by) = by.filter(|_| p < 1.0) else {
            return out;
        };
        let freeze = interval.mul_f64(1.0 - p);
        let why = format!(
            "{:.1} % of {} over the last {} ms against a limit of {} %{}",
            by.util.unwrap_or(0.0),
            by.uuid,
            elapsed.as_millis(),
            by.limit.unwrap_or(0),
            if by.work_conserving { " (contended)" } else { "" },
        );
        let targets = freezable(members, table);
        match policy {
            SmPolicy::Throttle if !targets.is_empty() => {
                let cgroup = cgroup.map(Path::to_path_buf);
                out.actions.push((
                    Action::Freeze {
                        targets: targets.clone(),
                        cgroup: cgroup.clone(),
                    },
                    format!(
                        "{why}: frozen {} ms of {} (run fraction {:.2})",
                        freeze.as_millis(),
                        interval.as_millis(),
                        p
                    ),
                ));
                self.frozen = Some(Frozen {
                    targets,
                    cgroup,
                    since: now,
                    thaw_at: now + freeze,
                });
            }
            SmPolicy::Throttle => {}
            SmPolicy::Report => out.reports.push(ActionReport::report(
                targets.iter().map(|t| t.pid).collect(),
                Some(by.uuid.clone()),
                format!(
                    "{why}: sm = \"report\", would freeze {} ms of each {} ms",
                    freeze.as_millis(),
                    interval.as_millis()
                ),
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
        let held = now.duration_since(f.since);
        self.frozen_for += held;
        let allowed = f.targets.iter().map(|t| t.pid).collect();
        Some((
            Action::Thaw {
                targets: f.targets,
                cgroup: f.cgroup,
            },
            format!("{why} after {} ms", held.as_millis()),
            allowed,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(util: Option<f64>, limit: u32) -> DeviceShare {
        DeviceShare {
            uuid: "GPU-0".into(),
            util,
            limit: Some(limit),
            work_conserving: false,
            others_busy: false,
        }
    }

    #[test]
    fn a_flat_out_container_gets_its_limit_in_one_step_and_keeps_it() {
        let one = [share(Some(100.0), 30)];
        let (p, by) = next_run_fraction(1.0, false, &one);
        assert!((p - 0.3).abs() < 1e-9, "{p}");
        assert_eq!(by.unwrap().uuid, "GPU-0");
        // Running 30 % of the time it measures 30 %: p stays.
        let (p2, _) = next_run_fraction(0.3, true, &[share(Some(30.0), 30)]);
        assert!((p2 - 0.3).abs() < 1e-9, "{p2}");
        // Spill (queued work runs while frozen): 40 % measured at p = 0.3 → p lowered to 0.225.
        let (p3, _) = next_run_fraction(0.3, true, &[share(Some(40.0), 30)]);
        assert!((p3 - 0.225).abs() < 1e-9, "{p3}");
    }

    #[test]
    fn steps_are_bounded_and_it_lets_go_when_demand_ends() {
        // 1 % limit, flat out: at most ×1/10 per pass, floor 1 %.
        let (p, _) = next_run_fraction(1.0, false, &[share(Some(100.0), 1)]);
        assert!((p - 0.1).abs() < 1e-9, "{p}");
        let (p, _) = next_run_fraction(0.05, true, &[share(Some(100.0), 1)]);
        assert!((p - P_MIN).abs() < 1e-9, "{p}");
        // The container stops: ×4 per pass back to 1.
        let (p, _) = next_run_fraction(0.3, true, &[share(Some(0.0), 30)]);
        assert!(p == 1.0, "{p}");
        let (p, _) = next_run_fraction(0.1, true, &[share(Some(0.0), 30)]);
        assert!((p - 0.4).abs() < 1e-9, "{p}");
    }

    #[test]
    fn engages_past_the_margin_only_and_holds_without_data() {
        assert_eq!(
            next_run_fraction(1.0, false, &[share(Some(34.0), 30)]).0,
            1.0,
            "within the margin"
        );
        assert!(next_run_fraction(1.0, false, &[share(Some(36.0), 30)]).0 < 1.0);
        // Engaged: the limit itself is the target.
        assert!(next_run_fraction(0.5, true, &[share(Some(34.0), 30)]).0 < 0.5);
        // No utilisation from NVML: hold while engaged, nothing otherwise.
        assert_eq!(next_run_fraction(0.4, true, &[share(None, 30)]).0, 0.4);
        assert_eq!(next_run_fraction(1.0, false, &[share(None, 30)]).0, 1.0);
        // No limit: nothing.
        let mut s = share(Some(100.0), 30);
        s.limit = None;
        assert_eq!(next_run_fraction(1.0, false, &[s]).0, 1.0);
    }

    #[test]
    fn work_conserving_policies_are_held_only_when_others_want_the_gpu() {
        let mut s = share(Some(100.0), 30);
        s.work_conserving = true;
        assert_eq!(next_run_fraction(1.0, false, &[s.clone()]).0, 1.0, "alone: burst");
        s.others_busy = true;
        assert!((next_run_fraction(1.0, false, &[s]).0 - 0.3).abs() < 1e-9);
    }

    #[test]
    fn the_strictest_device_decides() {
        let mut a = share(Some(100.0), 50);
        a.uuid = "GPU-a".into();
        let mut b = share(Some(100.0), 40);
        b.uuid = "GPU-b".into();
        let both = [a, b];
        let (p, by) = next_run_fraction(1.0, false, &both);
        assert!((p - 0.4).abs() < 1e-9, "{p}");
        assert_eq!(by.unwrap().uuid, "GPU-b");
    }
}
