//! Logging: the one path shared with the `cuquota` tool lives in `cuquota_core::log` (stderr lines
//! `cuquota[<pid>]: <level>: <message>`, one `write(2)` each, formatted on the stack: no allocation, no lock).

pub(crate) use cuquota_core::log::{enabled, set_level, Level};

/// Writes an error line regardless of the level (configuration errors must always be seen).
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) {
    cuquota_core::log::write(Level::Error, args);
}

/// `log!(Level::Warn, "format", args…)`.
macro_rules! log {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) {
            cuquota_core::log::write($lvl, format_args!($($arg)*));
        }
    };
}
pub(crate) use log;
