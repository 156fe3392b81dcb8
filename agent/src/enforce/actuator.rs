//! [`System`]: carries actions out on the host.
//!
//! - Signals go through a pidfd (`pidfd_open` + `pidfd_send_signal`, Linux 5.3+), opened and then checked
//!   against the start time the pass saw in `/proc`: a pid reused by another process since the pass is
//!   refused, never signalled. Without pidfds (older kernels) the start time is checked just before `kill(2)`.
//!   A target that has already exited is not an error.
//! - Freezing a cgroup: `cgroup.freeze` (v2) or `freezer.state` (v1: in the directory itself, or in the
//!   freezer hierarchy's directory of the same path, `/sys/fs/cgroup/freezer/<path>`), which stops the whole
//!   cgroup at once, processes that start meanwhile included. Without a freezer: SIGSTOP / SIGCONT to each
//!   target.

use rustix::io::Errno;
use rustix::process::{kill_process, pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use std::path::{Path, PathBuf};

use super::{Action, ActionError, Actuator, Target};

/// The actuator of the agent.
#[derive(Debug)]
pub struct System;

/// The v1 freezer file for cgroup directory `dir`: its own `freezer.state`, or the freezer hierarchy's
/// directory of the same path under `/sys/fs/cgroup/<controller>/…`.
pub fn v1_freezer(dir: &Path) -> Option<PathBuf> {
    let own = dir.join("freezer.state");
    if own.is_file() {
        return Some(own);
    }
    let rel = dir.strip_prefix("/sys/fs/cgroup").ok()?;
    let mut parts = rel.components();
    parts.next()?; // the controller's mount (memory, cpu,cpuacct, …)
    let f = Path::new("/sys/fs/cgroup/freezer")
        .join(parts.as_path())
        .join("freezer.state");
    f.is_file().then_some(f)
}

/// Whether the cgroup directory `dir` can be frozen as a whole.
pub fn has_freezer(dir: &Path) -> bool {
    dir.join("cgroup.freeze").is_file() || v1_freezer(dir).is_some()
}

/// Freezes (`true`) or thaws the cgroup `dir`; `None` when it has no freezer.
fn set_cgroup_frozen(dir: &Path, frozen: bool) -> Option<Result<&'static str, ActionError>> {
    let v2 = dir.join("cgroup.freeze");
    let (file, value, how) = if v2.is_file() {
        (v2, if frozen { "1" } else { "0" }, "cgroup v2 freezer")
    } else {
        (
            v1_freezer(dir)?,
            if frozen { "FROZEN" } else { "THAWED" },
            "cgroup v1 freezer",
        )
    };
    Some(
        std::fs::write(&file, value)
            .map(|_| how)
            .map_err(|source| ActionError::Freezer { file, source }),
    )
}

/// Whether `t` is still the process the pass saw (same start time); `None` when it is gone (a zombie has
/// exited: nothing to signal, not an error).
fn same_process(t: &Target) -> Option<bool> {
    let st = crate::members::ProcEntry::read(t.pid)?;
    (st.state != b'Z' || st.start_time != t.start_time).then_some(st.start_time == t.start_time)
}

/// Sends `sig` to `t`, if it is still the process the pass saw. `Ok(false)`: it is gone (nothing to do).
pub fn signal(t: &Target, sig: Signal) -> Result<bool, ActionError> {
    let failed = |errno: Errno| Err(ActionError::Signal { pid: t.pid, errno });
    let Some(pid) = Pid::from_raw(t.pid as i32) else {
        return Ok(false);
    };
    let fd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(Errno::SRCH) => return Ok(false),
        Err(Errno::NOSYS) => {
            // No pidfds: check, then kill (a pid reused between the two cannot be excluded here).
            return match same_process(t) {
                None | Some(false) => Ok(false),
                Some(true) => match kill_process(pid, sig) {
                    Ok(()) => Ok(true),
                    Err(Errno::SRCH) => Ok(false),
                    Err(e) => failed(e),
                },
            };
        }
        Err(errno) => return Err(ActionError::PidfdOpen { pid: t.pid, errno }),
    };
    // The descriptor pins the process that held the pid when it was opened; if that is still the one the
    // pass saw, the signal reaches it and nothing else.
    match same_process(t) {
        None => return Ok(false),
        Some(false) => return Err(ActionError::Reused(t.pid)),
        Some(true) => {}
    }
    match pidfd_send_signal(&fd, sig) {
        Ok(()) => Ok(true),
        Err(Errno::SRCH) => Ok(false),
        Err(e) => failed(e),
    }
}

/// Signals every target; the errors of those that failed, joined.
fn signal_all(targets: &[Target], sig: Signal, how: &'static str) -> Result<&'static str, ActionError> {
    let mut errors: Vec<ActionError> = targets.iter().filter_map(|t| signal(t, sig).err()).collect();
    match errors.len() {
        0 => Ok(how),
        1 => Err(errors.remove(0)),
        _ => Err(ActionError::Several(errors)),
    }
}

impl Actuator for System {
    fn apply(&mut self, action: &Action) -> Result<&'static str, ActionError> {
        match action {
            Action::Kill { targets, .. } => signal_all(targets, Signal::KILL, "SIGKILL"),
            Action::Freeze { targets, cgroup } => {
                match cgroup.as_deref().and_then(|d| set_cgroup_frozen(d, true)) {
                    Some(r) => r,
                    None => signal_all(targets, Signal::STOP, "SIGSTOP"),
                }
            }
            Action::Thaw { targets, cgroup } => {
                match cgroup.as_deref().and_then(|d| set_cgroup_frozen(d, false)) {
                    Some(r) => r,
                    None => signal_all(targets, Signal::CONT, "SIGCONT"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::process::{Child, Command};

    use super::super::execute;
    use super::*;

    fn spawn_sleep() -> (Child, Target) {
        let c = Command::new("sleep").arg("30").spawn().unwrap();
        let st = crate::members::ProcEntry::read(c.id()).unwrap();
        let t = Target {
            pid: c.id(),
            start_time: st.start_time,
        };
        (c, t)
    }

    fn state(pid: u32) -> u8 {
        crate::members::ProcEntry::read(pid).unwrap().state
    }

    fn wait_state(pid: u32, want: u8) -> bool {
        for _ in 0..500 {
            if state(pid) == want {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        false
    }

    /// The real actuator, asked through the seam to kill a process that is not a member: refused, and the
    /// process lives; asked for a member, it dies.
    #[test]
    fn a_non_member_survives_an_attempt_and_a_member_does_not() {
        let (mut stranger, ts) = spawn_sleep();
        let (mut member, tm) = spawn_sleep();
        let members: BTreeSet<u32> = [tm.pid].into_iter().collect();
        let out = execute(
            vec![(
                Action::Kill {
                    targets: vec![tm, ts],
                    device: "GPU-x".into(),
                },
                "test".into(),
            )],
            &members,
            &mut System,
        );
        assert!(!out[0].ok, "{out:?}");
        assert!(stranger.try_wait().unwrap().is_none(), "the stranger was killed");
        assert!(
            member.try_wait().unwrap().is_none(),
            "a refused action touches nobody"
        );
        let out = execute(
            vec![(
                Action::Kill {
                    targets: vec![tm],
                    device: "GPU-x".into(),
                },
                "test".into(),
            )],
            &members,
            &mut System,
        );
        assert!(out[0].ok, "{out:?}");
        let st = member.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        assert!(stranger.try_wait().unwrap().is_none());
        let _ = stranger.kill();
        let _ = stranger.wait();
    }

    #[test]
    fn a_reused_pid_is_not_signalled_and_a_gone_one_is_no_error() {
        let (mut c, t) = spawn_sleep();
        let wrong = Target {
            start_time: t.start_time + 1,
            ..t
        };
        let e = signal(&wrong, Signal::KILL).unwrap_err();
        assert!(e.to_string().contains("no longer"), "{e}");
        assert!(c.try_wait().unwrap().is_none());
        assert_eq!(signal(&t, Signal::KILL).map_err(|e| e.to_string()), Ok(true));
        c.wait().unwrap();
        assert_eq!(
            signal(&t, Signal::KILL).map_err(|e| e.to_string()),
            Ok(false),
            "gone: nothing to do"
        );
    }

    #[test]
    fn freeze_and_thaw_by_signals() {
        let (mut c, t) = spawn_sleep();
        let mut sys = System;
        assert_eq!(
            sys.apply(&Action::Freeze {
                targets: vec![t],
                cgroup: None
            })
            .map_err(|e| e.to_string()),
            Ok("SIGSTOP")
        );
        assert!(wait_state(t.pid, b'T'), "stopped");
        assert_eq!(
            sys.apply(&Action::Thaw {
                targets: vec![t],
                cgroup: None
            })
            .map_err(|e| e.to_string()),
            Ok("SIGCONT")
        );
        assert!(wait_state(t.pid, b'S'), "running again");
        // A cgroup directory without a freezer falls back to signals.
        let dir = std::env::temp_dir();
        assert_eq!(
            sys.apply(&Action::Freeze {
                targets: vec![t],
                cgroup: Some(dir.clone())
            })
            .map_err(|e| e.to_string()),
            Ok("SIGSTOP")
        );
        assert_eq!(
            sys.apply(&Action::Thaw {
                targets: vec![t],
                cgroup: Some(dir)
            })
            .map_err(|e| e.to_string()),
            Ok("SIGCONT")
        );
        let _ = c.kill();
        let _ = c.wait();
    }
}
