//! `cuquota`: the node-agent tool. Creates and edits the limits file (live: running processes see changes at
//! their next check), and shows a container's usage and achieved GPU share from its usage file.
//!
//! Hand-parsed arguments (no dependency beyond `cuquota-core`); errors go to stderr with exit code 2.

mod args;
mod json;
mod limits;
mod status;

use std::process::ExitCode;

const USAGE: &str = "\
usage:
  cuquota limits init <file> [--no-opt-out]
  cuquota limits set <file> --device <all|INDEX|GPU-UUID> [--memory SIZE] [--sm PERCENT]
                     [--policy default|hard|burst|disabled] [--weight N] [--priority high|low|none]
                     [--no-opt-out|--allow-opt-out]
  cuquota limits clear <file> --device <all|INDEX|GPU-UUID>
  cuquota limits show <file> [--json]
  cuquota status [--usage <file>] [--interval MS] [--json]

  SIZE: bytes in HAMi's syntax (3000m, 4g, 0x100000; 0 = no limit). PERCENT: 1-99 (0 = no limit).
  An INDEX entry follows the process's CUDA ordinals, which it picks with CUDA_VISIBLE_DEVICES: use GPU UUIDs
  (or all) for limits a process must not be able to move between devices.
  The usage file defaults to $CUQUOTA_USAGE_FILE, $CUDA_DEVICE_MEMORY_SHARED_CACHE, then /tmp/cuquota.usage.
";

/// A failure to report: message for stderr.
#[derive(Debug)]
pub struct CliError(pub String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.to_string())
    }
}

fn run(argv: Vec<String>) -> Result<(), CliError> {
    let mut a = args::Args::new(argv);
    match a.next_positional().as_deref() {
        Some("limits") => match a.next_positional().as_deref() {
            Some("init") => limits::init(a),
            Some("set") => limits::set(a),
            Some("clear") => limits::clear(a),
            Some("show") => limits::show(a),
            Some(other) => Err(CliError(format!("unknown limits command {other:?}\n\n{USAGE}"))),
            None => Err(CliError(format!("missing limits command\n\n{USAGE}"))),
        },
        Some("status") => status::run(a),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some("--version" | "version") => {
            println!("cuquota {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Some(other) => Err(CliError(format!("unknown command {other:?}\n\n{USAGE}"))),
        None => Err(CliError(USAGE.to_string())),
    }
}

/// The arguments after the program name; one that is not UTF-8 is an error (`std::env::args` would panic).
fn argv() -> Result<Vec<String>, CliError> {
    std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|a| CliError(format!("argument {:?} is not valid UTF-8", a.to_string_lossy())))
        })
        .collect()
}

fn main() -> ExitCode {
    match argv().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError(msg)) => {
            eprintln!("cuquota: {}", msg.trim_end());
            ExitCode::from(2)
        }
    }
}
