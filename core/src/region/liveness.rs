//! Is the process that owns a slot still alive? Pid plus start time, so a reused pid is not mistaken for the
//! original owner.
//!
//! Only slow paths call this (an admission about to fail, a periodic refresh, `cuquota status`): it reads
//! `/proc` and allocates. All processes sharing a usage file must share a pid namespace (one container), or
//! `kill(pid, 0)` would judge the wrong process.

use std::io::Read;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: R, S, D, Z, T, X, …
    pub state: u8,
    /// Field 4: the parent's pid.
    pub ppid: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
}

/// Parses the contents of a `/proc/<pid>/stat` file. The command name (field 2) may contain spaces and
/// parentheses, so parsing starts after the *last* `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    // fields after the name: state is field 3, ppid 4, so field 22 is the 18th after ppid.
    let start_time = fields.nth(17)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        start_time,
    })
}

/// Reads `/proc/<pid>/stat`; `None` if the process is gone or `/proc` is unavailable.
pub fn read_stat(pid: u32) -> Option<ProcStat> {
    let mut buf = String::with_capacity(512);
    std::fs::File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .read_to_string(&mut buf)
        .ok()?;
    parse_stat(&buf)
}

/// Start time of the calling process, 0 if unknown.
pub fn current_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t))
        .map_or(0, |s| s.start_time)
}

/// The calling process's pid.
pub fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Whether `pid` is alive and, when `start_time` is given and non-zero, is the same process (not a reuse of
/// the pid). Zombies count as dead: their GPU memory is already released.
pub fn is_alive(pid: u32, start_time: Option<u64>) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    if unsafe { libc::kill(raw, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    match read_stat(pid) {
        // kill said it exists. If /proc works, the stat vanished in between: it just exited. Without /proc,
        // trust kill.
        None => !proc_available(),
        Some(st) if st.state == b'Z' || st.state == b'X' => false,
        Some(st) => match start_time {
            Some(t) if t != 0 => st.start_time == t,
            _ => true,
        },
    }
}

fn proc_available() -> bool {
    std::path::Path::new("/proc/self/stat").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_parens_and_spaces() {
        let text = "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        let st = parse_stat(text).unwrap();
        assert_eq!(st.state, b'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.start_time, 987654);
    }

    #[test]
    fn self_is_alive_and_fake_start_is_not() {
        let me = current_pid();
        let start = current_start_time();
        assert_ne!(start, 0);
        assert!(is_alive(me, None));
        assert!(is_alive(me, Some(start)));
        assert!(!is_alive(me, Some(start + 1)));
        assert!(!is_alive(0, None));
        assert!(!is_alive(u32::MAX, None));
    }
}
