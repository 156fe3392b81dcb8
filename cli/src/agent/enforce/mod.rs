//! What the agent does about a container over its limits. Today every container is `report`: the agent
//! samples, compares and reports. Enforcement (issue 11) slots in here:
//! - a descriptor's `[enforce]` names a policy per resource ([`MemoryPolicy`], [`SmPolicy`]); a policy this
//!   build cannot carry out is refused when the descriptor is read ([`check_supported`]), so no container
//!   is ever believed to be enforced when it is not;
//! - [`plan`] turns one container's report into [`Action`]s;
//! - [`execute`] checks that every pid an action names is a member of that container in this pass, then hands
//!   the action to an [`Actuator`], and returns what happened for the report, the log and the
//!   `cuquota_agent_actions_total{action}` counter.

use std::collections::BTreeSet;

use serde::Serialize;

use super::descriptor::{Enforce, MemoryPolicy, SmPolicy};
use super::report::ContainerReport;

/// An action on some of one container's processes.
// Built by the enforcement policies of issue 11; today only the tests of `execute` build them.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL these processes (the container is over its memory cap on `device`).
    Kill {
        /// Host pids.
        pids: Vec<u32>,
        /// `GPU-…`.
        device: String,
    },
    /// Stop these processes (cgroup freezer, else SIGSTOP) to bring the SM share down.
    Freeze {
        /// Host pids.
        pids: Vec<u32>,
    },
    /// Let frozen processes run again.
    Thaw {
        /// Host pids.
        pids: Vec<u32>,
    },
}

/// Every kind of action, for the counters (each exported from the first pass, at 0).
pub const KINDS: [&str; 3] = ["kill", "freeze", "thaw"];

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
    pub fn pids(&self) -> &[u32] {
        match self {
            Action::Kill { pids, .. } | Action::Freeze { pids } | Action::Thaw { pids } => pids,
        }
    }
}

/// Carries out actions on processes.
pub trait Actuator {
    /// Does `action`; an error names what failed.
    fn apply(&mut self, action: &Action) -> Result<(), String>;
}

/// One action as the report shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ActionReport {
    /// `kill`, `freeze`, `thaw`.
    pub action: &'static str,
    /// The processes.
    pub pids: Vec<u32>,
    /// The device, for a kill.
    pub device: Option<String>,
    /// Whether it was carried out.
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
}

/// Refuses a policy this build cannot carry out (issue 11 adds `kill` and `throttle`).
pub fn check_supported(e: &Enforce) -> Result<(), String> {
    if e.memory == MemoryPolicy::Kill {
        return Err(
            "[enforce] memory = \"kill\" is not available in this version of the agent (only \"report\")"
                .into(),
        );
    }
    if e.sm == SmPolicy::Throttle {
        return Err(
            "[enforce] sm = \"throttle\" is not available in this version of the agent (only \"report\")"
                .into(),
        );
    }
    Ok(())
}

/// The actions one container's report calls for under its policy. Every policy this build accepts is
/// `report` ([`check_supported`] refuses the others when the descriptor is read): nothing to do.
pub fn plan(enforce: &Enforce, _report: &ContainerReport) -> Vec<Action> {
    debug_assert!(check_supported(enforce).is_ok());
    Vec::new()
}

/// Carries out `actions` on a container whose members are `members`: an action naming any other process is
/// refused as a whole (the agent never touches a process of another container or of nobody's).
pub fn execute(
    actions: Vec<Action>,
    members: &BTreeSet<u32>,
    actuator: &mut dyn Actuator,
) -> Vec<ActionReport> {
    actions
        .into_iter()
        .map(|a| {
            let strangers: Vec<u32> = a
                .pids()
                .iter()
                .copied()
                .filter(|p| !members.contains(p))
                .collect();
            let result = if a.pids().is_empty() {
                Err("no process named".to_string())
            } else if !strangers.is_empty() {
                Err(format!(
                    "refused: pids {strangers:?} are not members of this container"
                ))
            } else {
                actuator.apply(&a)
            };
            ActionReport {
                action: a.kind(),
                pids: a.pids().to_vec(),
                device: match &a {
                    Action::Kill { device, .. } => Some(device.clone()),
                    _ => None,
                },
                ok: result.is_ok(),
                error: result.err(),
            }
        })
        .collect()
}

/// The actuator of this build: it has nothing to carry out (every policy is `report`), and says so if asked.
pub struct NoActuator;

impl Actuator for NoActuator {
    fn apply(&mut self, action: &Action) -> Result<(), String> {
        Err(format!(
            "{}: not available in this version of the agent",
            action.kind()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder(Vec<Action>);

    impl Actuator for Recorder {
        fn apply(&mut self, a: &Action) -> Result<(), String> {
            self.0.push(a.clone());
            Ok(())
        }
    }

    #[test]
    fn actions_on_non_members_are_refused_whole() {
        let members: BTreeSet<u32> = [10, 11].into_iter().collect();
        let mut r = Recorder(Vec::new());
        let out = execute(
            vec![
                Action::Freeze { pids: vec![10, 11] },
                Action::Kill {
                    pids: vec![11, 99],
                    device: "GPU-x".into(),
                },
                Action::Thaw { pids: vec![] },
            ],
            &members,
            &mut r,
        );
        assert_eq!(
            r.0,
            vec![Action::Freeze { pids: vec![10, 11] }],
            "only the members' action ran"
        );
        assert!(out[0].ok && !out[1].ok && !out[2].ok);
        assert!(out[1].error.as_deref().unwrap().contains("99"));
        assert_eq!(out[1].device.as_deref(), Some("GPU-x"));
        assert_eq!(out[1].action, "kill");
    }

    #[test]
    fn report_only_plans_nothing_and_the_rest_is_refused_up_front() {
        assert!(check_supported(&Enforce::default()).is_ok());
        assert!(check_supported(&Enforce {
            memory: MemoryPolicy::Kill,
            ..Default::default()
        })
        .is_err());
        assert!(check_supported(&Enforce {
            sm: SmPolicy::Throttle,
            ..Default::default()
        })
        .is_err());
        assert!(NoActuator.apply(&Action::Thaw { pids: vec![1] }).is_err());
    }
}
