//! [`ConfigError`]: every way configuration can be wrong, each naming what to fix.

use std::fmt;
use std::path::PathBuf;

/// Invalid configuration. The message names the variable (or file key), the offending value and what is
/// expected, e.g. `CUDA_DEVICE_MEMORY_LIMIT_1="12x": expected a byte size such as 3000m or 4g`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A variable's value does not parse.
    InvalidValue {
        /// Variable name.
        var: String,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// A HAMi name and its cuquota equivalent are both set and disagree.
    Conflict {
        /// The HAMi variable.
        hami_var: String,
        /// Its value.
        hami_value: String,
        /// The cuquota variable.
        our_var: String,
        /// Its value.
        our_value: String,
    },
    /// A `CUQUOTA_*` variable (or a `…_LIMIT_<i>` form) that cuquota does not know: most likely a typo.
    UnknownVariable {
        /// The name as given.
        var: String,
        /// The closest known name, if one is close.
        suggestion: Option<&'static str>,
    },
    /// A variable cuquota reads appears twice in the environment with different values (possible with
    /// `execve`): `getenv` (the driver, HAMi) would use the first, so neither value can be trusted.
    Duplicate {
        /// Variable name.
        var: String,
        /// The first value.
        first: String,
        /// A later, different value.
        second: String,
    },
    /// A variable cuquota reads holds bytes that are not UTF-8.
    NotUnicode {
        /// Variable name.
        var: String,
    },
    /// The file named by `CUQUOTA_CONFIG` cannot be read.
    FileRead {
        /// The file.
        path: PathBuf,
        /// The OS error text.
        error: String,
    },
    /// The file named by `CUQUOTA_CONFIG` is not valid TOML or has unknown keys / wrong types.
    FileParse {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message (with line and column).
        message: String,
    },
    /// A key in the TOML file has a value of the right type but an invalid content.
    FileValue {
        /// The file.
        path: PathBuf,
        /// Dotted key, e.g. `device[1].memory_limit`.
        key: String,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidValue { var, value, expected } => write!(f, "{var}={value:?}: expected {expected}"),
            ConfigError::Conflict { hami_var, hami_value, our_var, our_value } => write!(
                f,
                "{hami_var}={hami_value:?} and {our_var}={our_value:?} disagree: set only one of them, or both \
                 to the same value"
            ),
            ConfigError::UnknownVariable { var, suggestion: Some(s) } => {
                write!(f, "{var}: unknown cuquota variable (did you mean {s}?)")
            }
            ConfigError::UnknownVariable { var, suggestion: None } => write!(
                f,
                "{var}: unknown cuquota variable (see docs/configuration.md for the list; unset it to continue)"
            ),
            ConfigError::Duplicate { var, first, second } => write!(
                f,
                "{var} is set twice, to {first:?} and to {second:?}: remove one from the environment"
            ),
            ConfigError::NotUnicode { var } => write!(f, "{var}: value is not valid UTF-8"),
            ConfigError::FileRead { path, error } => {
                write!(f, "CUQUOTA_CONFIG={}: cannot read the file: {error}", path.display())
            }
            ConfigError::FileParse { path, message } => {
                write!(f, "CUQUOTA_CONFIG={}: invalid config file: {}", path.display(), message.trim_end())
            }
            ConfigError::FileValue { path, key, value, expected } => {
                write!(f, "{}: {key} = {value}: expected {expected}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}
