//! What the agent does about a container over its limits, per the descriptor's `[enforce]`:
//! - `memory = "kill"` ([`memory`]): a container whose member processes hold more device memory on a GPU than
//!   its cap (NVML's figure) for [`memory::GRACE`] consecutive passes loses its largest processes on that GPU
//!   (SIGKILL) until the rest fit;
//! - `sm = "throttle"` ([`throttle`]): a container whose measured device time on a GPU runs past its SM limit
//!   is frozen (cgroup freezer, else SIGSTOP/SIGCONT) until that debt is repaid, and its processes that ran
//!   are killed where freezing does not hold it (the debt passes a grace while it is frozen);
//! - `report`: the same judgement, logged and counted as `report`, and nothing done.
//!
//! Planners turn a container's report into [`Action`]s; [`execute`] checks that every process an action names
//! is a member of that container (else the whole action is refused: the agent never touches a process of
//! another container or of nobody's), then hands it to an [`Actuator`] ([`actuator::System`] in the agent),
//! and returns what happened for the report, the log and `cuquota_agent_actions_total{action}`.

pub mod actuator;
pub mod memory;
pub mod throttle;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

/// A process as the agent saw it in `/proc`: its pid and start time, so that an action never reaches another
/// process that reused the pid meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    /// Host pid.
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22.
    pub start_time: u64,
}

/// An action on some of one container's processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL these processes (the container is over its memory cap on `device`).
    Kill {
        /// The processes.
        targets: Vec<Target>,
        /// `GPU-…`.
        device: String,
    },
    /// Stop the container: its cgroup's freezer when `cgroup` is given, else SIGSTOP to each target.
    Freeze {
        /// The container's processes.
        targets: Vec<Target>,
        /// The container's cgroup directory (the member source), when it is one.
        cgroup: Option<PathBuf>,
    },
    /// Undo a [`Action::Freeze`] (the same targets and cgroup).
    Thaw {
        /// The processes the freeze stopped.
        targets: Vec<Target>,
        /// The cgroup the freeze froze.
        cgroup: Option<PathBuf>,
    },
}

/// Every kind of action, for the counters (each exported from the first pass, at 0). `report`: a container
/// under a `report` policy was over a limit (what would have been done is in the record's `detail`).
pub const KINDS: [&str; 4] = ["kill", "freeze", "thaw", "report"];

impl Action {
    /// The counter label.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Kill { .. } => "kill",
            Action::Freeze { .. } => "freeze",
            Action::Thaw { .. } => "thaw",
        }
    }

    /// The processes it touches.
    pub fn targets(&self) -> &[Target] {
        match self {
            Action::Kill { targets, .. } | Action::Freeze { targets, .. } | Action::Thaw { targets, .. } => {
                targets
            }
        }
    }
}

/// What a pass decided for one container.
#[derive(Debug, Default)]
pub struct Decision {
    /// Actions to carry out, with the reason.
    pub actions: Vec<(Action, String)>,
    /// `report` records.
    pub reports: Vec<ActionReport>,
}

/// Why an action was not carried out (the report's `error`).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The action names no process.
    #[error("no process named")]
    NoTarget,
    /// The action names processes outside the container: refused whole.
    #[error("refused: pids {0:?} are not members of this container")]
    Strangers(Vec<u32>),
    /// A signal failed.
    #[error("pid {pid}: {errno}")]
    Signal {
        /// The target.
        pid: u32,
        /// Why.
        errno: rustix::io::Errno,
    },
    /// No pidfd could be opened to the target.
    #[error("pidfd_open({pid}): {errno}")]
    PidfdOpen {
        /// The target.
        pid: u32,
        /// Why.
        errno: rustix::io::Errno,
    },
    /// The pid holds another process than the pass saw.
    #[error("pid {0} is no longer the process the agent saw (exited, pid reused): not signalled")]
    Reused(u32),
    /// The cgroup freezer file could not be written.
    #[error("{}: {source}", .file.display())]
    Freezer {
        /// `cgroup.freeze` or `freezer.state`.
        file: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Several targets failed: each, joined by `; `.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<ActionError>),
}

/// Carries out actions on processes.
pub trait Actuator {
    /// Does `action`; an error names what failed. Returns how it was done (e.g. `cgroup v2 freezer`).
    fn apply(&mut self, action: &Action) -> Result<&'static str, ActionError>;
}

/// One action as the report shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ActionReport {
    /// `kill`, `freeze`, `thaw`, `report`.
    pub action: &'static str,
    /// The processes (host pids).
    pub pids: Vec<u32>,
    /// The device, for a kill or a memory report.
    pub device: Option<String>,
    /// Whether it was carried out (a `report` record: always).
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
    /// Why it was done, and how.
    pub detail: Option<String>,
}

impl ActionReport {
    /// A `report`-policy record: what the agent found and would have done.
    pub fn report(pids: Vec<u32>, device: Option<String>, detail: String) -> ActionReport {
        ActionReport {
            action: "report",
            pids,
            device,
            ok: true,
            error: None,
            detail: Some(detail),
        }
    }
}

/// Carries out `actions` on a container whose members are `members` (host pids), each with the reason the
/// planner gave: an action naming any other process is refused as a whole (the agent never touches a
/// process of another container or of nobody's).
pub fn execute(
    actions: Vec<(Action, String)>,
    members: &BTreeSet<u32>,
    actuator: &mut dyn Actuator,
) -> Vec<ActionReport> {
    actions
        .into_iter()
        .map(|(a, why)| {
            let strangers: Vec<u32> = a
                .targets()
                .iter()
                .map(|t| t.pid)
                .filter(|p| !members.contains(p))
                .collect();
            let result = if a.targets().is_empty() {
                Err(ActionError::NoTarget)
            } else if !strangers.is_empty() {
                Err(ActionError::Strangers(strangers))
            } else {
                actuator.apply(&a)
            };
            let (ok, error, how) = match result {
                Ok(how) => (true, None, how),
                Err(e) => (false, Some(e.to_string()), ""),
            };
            ActionReport {
                action: a.kind(),
                pids: a.targets().iter().map(|t| t.pid).collect(),
                device: match &a {
                    Action::Kill { device, .. } => Some(device.clone()),
                    _ => None,
                },
                ok,
                error,
                detail: Some(if how.is_empty() {
                    why
                } else {
                    format!("{why} ({how})")
                }),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Records what it is asked to do.
    #[derive(Default)]
    pub(crate) struct Recorder(pub Vec<Action>);

    impl Actuator for Recorder {
        fn apply(&mut self, a: &Action) -> Result<&'static str, ActionError> {
            self.0.push(a.clone());
            Ok("recorded")
        }
    }

    pub(crate) fn t(pid: u32) -> Target {
        Target { pid, start_time: 1 }
    }

    #[test]
    fn actions_on_non_members_are_refused_whole() {
        let members: BTreeSet<u32> = [10, 11].into_iter().collect();
        let mut r = Recorder::default();
        let freeze = Action::Freeze {
            targets: vec![t(10), t(11)],
            cgroup: None,
        };
        let out = execute(
            vec![
                (freeze.clone(), "over".into()),
                (
                    Action::Kill {
                        targets: vec![t(11), t(99)],
                        device: "GPU-x".into(),
                    },
                    "over".into(),
                ),
                (
                    Action::Thaw {
                        targets: vec![],
                        cgroup: None,
                    },
                    "".into(),
                ),
            ],
            &members,
            &mut r,
        );
        assert_eq!(r.0, vec![freeze], "only the members' action ran");
        assert!(out[0].ok && !out[1].ok && !out[2].ok);
        assert_eq!(out[0].detail.as_deref(), Some("over (recorded)"));
        assert!(out[1].error.as_deref().unwrap().contains("99"));
        assert_eq!(out[1].device.as_deref(), Some("GPU-x"));
        assert_eq!(out[1].action, "kill");
        assert_eq!(out[1].pids, vec![11, 99]);
    }
}
