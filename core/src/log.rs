//! The one logging path of the shim and the `cuquota` tool: lines on stderr, `cuquota[<pid>]: <level>: <message>`,
//! each written with a single `write(2)` so lines from concurrent threads and processes do not interleave,
//! formatted into a stack buffer (no allocation, no lock).
//!
//! Why not `tracing`/`log`: the shim lives inside arbitrary programs; it must not allocate or lock in hooks that
//! may run inside the program's allocator, and must not pull in a subscriber. The level is one relaxed atomic
//! load, so a disabled message costs nothing but that load.
//!
//! The level comes from `CUQUOTA_LOG` (`error` … `trace`), else HAMi's `LIBCUDA_LOG_LEVEL` (0–4), else `warn`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::ConfigError;
pub use crate::config::LogLevel as Level;

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the level.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether `level` is enabled (one relaxed load).
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// The level named by `CUQUOTA_LOG` / `LIBCUDA_LOG_LEVEL` as `lookup` sees them (`warn` when neither is set).
pub fn level_from(lookup: impl Fn(&str) -> Option<String>) -> Result<Level, ConfigError> {
    crate::config::log_level_from(&lookup).map(|l| l.unwrap_or(Level::Warn))
}

const BUF: usize = 512;

/// Fixed-capacity buffer; output beyond capacity is truncated (marked with "…").
struct StackBuf {
    buf: [u8; BUF],
    len: usize,
    truncated: bool,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - 4 - self.len; // keep space for "…\n"
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.truncated = true;
        }
        Ok(())
    }
}

/// Writes one line at `level` (whether or not it is enabled: callers check [`enabled`]). Never fails, never
/// allocates.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    // SAFETY: getpid has no preconditions; called per line (not cached) so a forked child logs its own pid.
    let pid = unsafe { libc::getpid() };
    let b = render(pid, level, args);
    // SAFETY: writing an initialised buffer of `len` bytes to fd 2.
    unsafe {
        libc::write(2, b.buf.as_ptr().cast(), b.len);
    }
}

fn render(pid: i32, level: Level, args: std::fmt::Arguments<'_>) -> StackBuf {
    let mut b = StackBuf {
        buf: [0; BUF],
        len: 0,
        truncated: false,
    };
    let _ = write!(b, "cuquota[{pid}]: {}: ", level.as_str());
    let _ = b.write_fmt(args);
    if b.truncated {
        let end = "…".as_bytes();
        b.buf[b.len..b.len + end.len()].copy_from_slice(end);
        b.len += end.len();
    }
    b.buf[b.len] = b'\n';
    b.len += 1;
    b
}

/// `log!(Level::Warn, "format", args…)`: formats and writes only when the level is enabled.
#[macro_export]
macro_rules! log {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write($lvl, format_args!($($arg)*));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(b: &StackBuf) -> &str {
        std::str::from_utf8(&b.buf[..b.len]).expect("valid UTF-8")
    }

    #[test]
    fn lines_carry_pid_and_level() {
        let b = render(42, Level::Info, format_args!("device {} ok", 3));
        assert_eq!(line(&b), "cuquota[42]: info: device 3 ok\n");
    }

    #[test]
    fn long_lines_are_truncated_to_the_buffer_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let b = render(1, Level::Warn, format_args!("{long}"));
        let l = line(&b);
        assert!(l.starts_with("cuquota[1]: warn: éé"));
        assert!(l.ends_with("é…\n"), "{l:?}");
        assert!(b.len <= b.buf.len());
    }

    #[test]
    fn level_from_the_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(level_from(env(&[])).unwrap(), Level::Warn);
        assert_eq!(
            level_from(env(&[("LIBCUDA_LOG_LEVEL", "3")])).unwrap(),
            Level::Info
        );
        assert_eq!(
            level_from(env(&[("LIBCUDA_LOG_LEVEL", "0"), ("CUQUOTA_LOG", "info")])).unwrap(),
            Level::Info
        );
        assert!(level_from(env(&[("CUQUOTA_LOG", "loud")])).is_err());
    }

    #[test]
    fn enabled_follows_the_level() {
        set_level(Level::Error);
        assert!(enabled(Level::Error) && !enabled(Level::Warn));
        set_level(Level::Trace);
        assert!(enabled(Level::Debug));
        set_level(Level::Warn);
    }
}
