//! `cuquota`: run programs under cuquota, show the demo, manage the agent's limits files, show a container's
//! usage, serve Prometheus metrics, and run the node agent. See docs/cli.md.

mod demo;
mod limits;
mod locate;
mod metrics;
mod priority;
mod run;
mod status;

use cuquota_agent::{nvml, output};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Exit codes, shown at the end of `cuquota --help` (and in docs/cli.md).
const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    demo: a tenant did not get what it asked for
  2    bad arguments, or the command failed (one line on stderr says why)
  run  the program's exit status; 128+N if signal N killed it;
       125 cuquota could not start it, 126 not executable, 127 not found";

#[derive(Parser)]
#[command(
    name = "cuquota",
    version,
    about = "Share one NVIDIA GPU between containers: memory caps and SM-time limits, enforced by libcuquota.so",
    after_help = EXIT_CODES,
    arg_required_else_help = true,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libcuquota.so preloaded and limits set (on the simulated GPU when there is no NVIDIA
    /// driver)
    Run(run::RunArgs),
    /// Three tenants share one GPU under different caps and SM limits; a limit changes live halfway
    Demo(demo::DemoArgs),
    /// Create, change and show an agent limits file (running programs see changes live)
    Limits {
        #[command(subcommand)]
        command: limits::LimitsCommand,
    },
    /// Create and show a container's priority file (best-effort tenants yield to high-priority ones through them)
    Priority {
        #[command(subcommand)]
        command: priority::PriorityCommand,
    },
    /// A container's usage per device: limits, memory used, processes, GPU share achieved
    Status(status::StatusArgs),
    /// Serve a container's usage as Prometheus metrics (HAMi's metric names and cuquota's own)
    Metrics(metrics::MetricsArgs),
    /// The node agent: watch every container's processes on the GPU through NVML, report, serve metrics
    Agent(cuquota_agent::AgentArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
}

/// A failure: a one-line message for stderr and the exit code (2 unless a command says otherwise).
#[derive(Debug)]
pub struct CliError {
    /// What went wrong (one line).
    pub msg: String,
    /// Exit code.
    pub code: u8,
}

impl CliError {
    /// A failure with exit code 2.
    pub fn new(msg: impl Into<String>) -> CliError {
        CliError {
            msg: msg.into(),
            code: 2,
        }
    }
}

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError::new(e.to_string())
    }
}

/// A command's result: the exit code on success.
pub type CmdResult = Result<u8, CliError>;

/// A clap error as one line: the message, then any tips in parentheses; the usage and "for more information"
/// paragraphs are dropped (`--help` shows them).
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts = text
        .split("\n\n")
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.starts_with("Usage:") && !p.starts_with("For more information"))
        .map(|p| {
            // Continuation lines join with a space; each "tip:" line is its own item.
            let mut out = String::new();
            for l in p.lines().map(str::trim).filter(|l| !l.is_empty()) {
                if !out.is_empty() {
                    out.push_str(if l.starts_with("tip:") { "; " } else { " " });
                }
                out.push_str(&l.split_whitespace().collect::<Vec<_>>().join(" "));
            }
            out
        });
    let first = parts.next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(&first).to_string();
    let tips: Vec<String> = parts.collect();
    if tips.is_empty() {
        first
    } else {
        format!("{first} ({})", tips.join("; "))
    }
}

fn dispatch(cli: Cli) -> CmdResult {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Limits { command } => limits::run(command),
        Command::Priority { command } => priority::run(command),
        Command::Status(a) => status::run(a),
        Command::Metrics(a) => metrics::run(a),
        Command::Agent(a) => Ok(cuquota_agent::run(a)?),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "cuquota", &mut std::io::stdout());
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    match cuquota_core::log::level_from(|k| std::env::var(k).ok()) {
        Ok(l) => cuquota_core::log::set_level(l),
        // The tool's own logs stay at warn; the library in a program started by `run` refuses the value.
        Err(e) => eprintln!("cuquota: {e}; logging at warn"),
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            return match e.kind() {
                // --help, -h, --version, -V: stdout, exit 0.
                DisplayHelp | DisplayVersion => {
                    let _ = e.print();
                    ExitCode::SUCCESS
                }
                // `cuquota` alone (or a command group alone): the help on stderr, exit 2.
                DisplayHelpOnMissingArgumentOrSubcommand => {
                    eprint!("{}", e.render());
                    ExitCode::from(2)
                }
                _ => {
                    eprintln!("cuquota: {}", one_line(&e));
                    ExitCode::from(2)
                }
            };
        }
    };
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(CliError { msg, code }) => {
            eprintln!("cuquota: {}", msg.trim_end());
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn clap_errors_become_one_line() {
        for args in [
            &["cuquota", "limits", "set", "f", "--device", "0", "--memroy", "1g"][..],
            &["cuquota", "limits", "show"][..],
            &["cuquota", "frobnicate"][..],
            &[
                "cuquota", "limits", "set", "f", "--device", "0", "--memory", "12x",
            ][..],
        ] {
            let e = Cli::try_parse_from(args).err().expect("an error");
            let l = one_line(&e);
            assert!(
                !l.contains('\n') && !l.is_empty() && !l.starts_with("error"),
                "{args:?}: {l}"
            );
        }
        let e = Cli::try_parse_from(["cuquota", "limits", "set", "f", "--device", "0", "--memroy", "1g"])
            .err()
            .unwrap();
        assert!(one_line(&e).contains("--memory"), "{}", one_line(&e));
    }
}
