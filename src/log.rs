//! Minimal logging to stderr: a level set once from the configuration, one `write(2)` per message so lines from
//! concurrent threads and processes do not interleave, formatted into a stack buffer (no allocation).
//!
//! Why not `tracing`/`log`: the library lives inside arbitrary programs; it must not allocate or lock in hooks
//! that may run inside the program's allocator, and must not pull in a subscriber.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

/// Levels, ordered: a message is written when its level ≤ the configured one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub enum Level {
    /// Fatal for CUDA use (configuration errors).
    Error = 1,
    /// Something the user should fix.
    Warn = 2,
    /// One-off lifecycle events.
    Info = 3,
    /// Per-call decisions.
    Debug = 4,
    /// Everything.
    Trace = 5,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the level (from `core::config::LogLevel`).
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether `level` is enabled (one relaxed load).
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Fixed-capacity buffer; output beyond capacity is truncated (marked with "…").
struct StackBuf {
    buf: [u8; 512],
    len: usize,
    truncated: bool,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - 4 - self.len; // keep space for "…\n"
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.truncated = true;
        }
        Ok(())
    }
}

/// Writes `cuquota: <message>\n` with a single `write(2)` to fd 2. Never fails, never allocates.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    let b = render(args);
    // SAFETY: writing an initialised buffer of `len` bytes to fd 2.
    unsafe {
        libc::write(2, b.buf.as_ptr().cast(), b.len);
    }
}

/// `cuquota: <message>\n`, truncated with "…" to the buffer.
fn render(args: std::fmt::Arguments<'_>) -> StackBuf {
    let mut b = StackBuf {
        buf: [0; 512],
        len: 0,
        truncated: false,
    };
    let _ = b.write_str("cuquota: ");
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

/// `log!(Level::Warn, "format", args…)`.
macro_rules! log {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write_line(format_args!($($arg)*));
        }
    };
}
pub(crate) use log;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_truncated_to_the_buffer() {
        let long = "x".repeat(2000);
        let b = render(format_args!("{long}"));
        let line = std::str::from_utf8(&b.buf[..b.len]).expect("valid UTF-8");
        assert!(line.starts_with("cuquota: xxx"));
        assert!(line.ends_with("x…\n"), "{line:?}");
        assert!(b.len <= b.buf.len());
    }

    #[test]
    fn short_lines_are_whole() {
        let b = render(format_args!("device {} ok", 3));
        assert_eq!(&b.buf[..b.len], b"cuquota: device 3 ok\n");
    }
}
