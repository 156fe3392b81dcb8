//! `cuquota limits …`: create, edit and show the agent's limits file. Edits go through the seqlock, so running
//! processes pick them up at their next check without restarting.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use cuquota_core::region::layout::{format_uuid, LIMITS_FLAG_NO_OPT_OUT, LIMITS_FLAG_OPT_OUT_ALLOWED};
use cuquota_core::region::{DeviceSelector, FileId, LimitsReader, LimitsSnapshot, LimitsWriter, UsageRegion};
use cuquota_core::{Policy, PolicyKind, Priority};
use serde::Serialize;

use crate::output::{self, parse_size_arg, parse_sm_arg};
use crate::{CliError, CmdResult};

/// Schema of `limits … --json` (docs/schemas/limits.v1.json).
pub(crate) const SCHEMA: &str = "cuquota.limits/v1";

#[derive(Subcommand)]
pub(crate) enum LimitsCommand {
    /// Create a limits file with no entries (no limits), or check an existing one
    Init {
        /// The limits file
        file: PathBuf,
        /// Forbid processes to opt out (CUDA_DISABLE_CONTROL, CUQUOTA_DISABLE): the default
        #[arg(long, conflicts_with = "allow_opt_out")]
        no_opt_out: bool,
        /// Allow processes to opt out (CUDA_DISABLE_CONTROL, CUQUOTA_DISABLE)
        #[arg(long)]
        allow_opt_out: bool,
    },
    /// Set limits of a device (fields not given keep their values); running programs see the change live
    Set(SetArgs),
    /// Remove a device's entry
    Clear {
        /// The limits file
        file: PathBuf,
        /// Which entry: all, a CUDA ordinal, or a GPU-… UUID
        #[arg(long, value_parser = parse_selector)]
        device: DeviceSelector,
        /// Print the file as JSON afterwards (schema cuquota.limits/v1)
        #[arg(long)]
        json: bool,
    },
    /// Show, publish or withdraw the container's member host pids (the agent does this every pass; the shim
    /// shows a process only these in NVML's per-process queries)
    #[command(after_help = "\
Without --set or --clear the list is shown. Members are host pids (as NVML reports them). With no agent \
membership (--clear, or never set) the shim falls back to the container's usage file, which its processes \
can write: not tenant-proof.")]
    Members {
        /// The limits file
        file: PathBuf,
        /// Publish exactly these host pids (comma-separated; an empty value publishes an empty list)
        #[arg(long, value_name = "PID,PID,…", value_parser = parse_pid_list, conflicts_with = "clear")]
        set: Option<PidList>,
        /// Withdraw the agent's membership
        #[arg(long)]
        clear: bool,
        /// Print the file as JSON afterwards (schema cuquota.limits/v1)
        #[arg(long)]
        json: bool,
    },
    /// Show the file's entries
    Show {
        /// The limits file
        file: PathBuf,
        /// JSON on stdout (schema cuquota.limits/v1)
        #[arg(long)]
        json: bool,
    },
}

/// `limits set`.
#[derive(Args)]
#[command(after_help = "\
An ordinal entry follows the process's CUDA ordinals, which it picks with CUDA_VISIBLE_DEVICES: use GPU UUIDs \
(or all) for limits a process must not be able to move between devices.")]
pub(crate) struct SetArgs {
    /// The limits file
    file: PathBuf,
    /// Which entry: all, a CUDA ordinal, or a GPU-… UUID
    #[arg(long, value_parser = parse_selector)]
    device: DeviceSelector,
    /// Memory cap in HAMi's syntax: 4g, 3000m, 0x100000 (0 = no limit): the size the device is shown as
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    memory: Option<u64>,
    /// Guaranteed memory (the Kubernetes request), at most --memory; the node's agent admits requests only while
    /// their sum on a GPU fits it. 0 = none: the request is the cap (not elastic). Above it, an idle tenant's
    /// memory may be moved to host memory for others waiting within theirs (agent --pinned-host-budget)
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    request: Option<u64>,
    /// SM-time share in percent, 1-99 (0 or 100 = no limit)
    #[arg(long, value_name = "PERCENT", value_parser = parse_sm_arg)]
    sm: Option<u32>,
    /// SM policy
    #[arg(long)]
    policy: Option<PolicyArg>,
    /// Share of spare GPU time in burst mode, 1-1000 (0 = default)
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1000))]
    weight: Option<u32>,
    /// Priority on the device (HAMi's CUDA_TASK_PRIORITY 0 / 1); none clears it. Enforced through the node's
    /// priority file (`cuquota priority init`)
    #[arg(long)]
    priority: Option<PriorityArg>,
    /// Device memory this tenant must leave free for high-priority tenants (0 = none); ignored on a
    /// high-priority entry
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    reserve: Option<u64>,
    /// Ask (on) this entry's elastic tenants to move their idle memory above the request to host memory, or end
    /// the ask (off; the next use brings it back): the limits file's evict bit, which the agent's reclaim sets
    /// and clears itself (an agent running on this file overrides it)
    #[arg(long)]
    evict: Option<Switch>,
    /// Forbid processes to opt out (the default of a new file)
    #[arg(long, conflicts_with = "allow_opt_out")]
    no_opt_out: bool,
    /// Allow processes to opt out (CUDA_DISABLE_CONTROL, CUQUOTA_DISABLE)
    #[arg(long)]
    allow_opt_out: bool,
    /// Bind the container's usage file: its absolute path as the container's processes see it, which they
    /// then use whatever CUQUOTA_USAGE_FILE says; `none` unbinds. The file's identity is recorded too (a file
    /// put in its place later is refused), so it must exist here: see --usage-host
    #[arg(long, value_name = "PATH")]
    usage: Option<PathBuf>,
    /// The same usage file as this command sees it, when its path differs from the container's (a host
    /// directory mounted into the container); created if missing. Default: the --usage path
    #[arg(long, value_name = "HOST_PATH", requires = "usage")]
    usage_host: Option<PathBuf>,
    /// Print the file as JSON afterwards (schema cuquota.limits/v1)
    #[arg(long)]
    json: bool,
}

/// `--evict on|off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Switch {
    On,
    Off,
}

/// An SM policy on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// cuquota's default (burst)
    Default,
    /// Never above the limit, even on an idle GPU
    Hard,
    /// Work-conserving: use time nobody else wants
    Burst,
    /// No SM limiting
    #[value(alias = "disable")]
    Disabled,
}

impl PolicyArg {
    /// The core policy kind.
    pub(crate) fn kind(self) -> PolicyKind {
        match self {
            PolicyArg::Default => PolicyKind::Default,
            PolicyArg::Hard => PolicyKind::Hard,
            PolicyArg::Burst => PolicyKind::Burst,
            PolicyArg::Disabled => PolicyKind::Disabled,
        }
    }

    /// The name `CUQUOTA_POLICY` takes.
    pub(crate) fn name(self) -> &'static str {
        self.kind().as_str()
    }
}

/// A priority on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PriorityArg {
    /// Latency-critical (CUDA_TASK_PRIORITY=0)
    High,
    /// Best effort (CUDA_TASK_PRIORITY=1)
    Low,
    /// No priority
    None,
}

impl PriorityArg {
    fn priority(self) -> Option<Priority> {
        match self {
            PriorityArg::High => Some(Priority::High),
            PriorityArg::Low => Some(Priority::Low),
            PriorityArg::None => None,
        }
    }
}

/// A `--set` member list.
#[derive(Clone, Debug)]
pub(crate) struct PidList(Vec<u32>);

/// A `limits set` argument that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ArgError {
    /// A member that is no pid.
    #[error("{0:?} is not a pid (a positive integer)")]
    NotAPid(String),
    /// A device that is no selector.
    #[error("expected all, a CUDA ordinal or a GPU-… UUID")]
    Selector,
}

fn parse_pid_list(s: &str) -> Result<PidList, ArgError> {
    if s.trim().is_empty() {
        return Ok(PidList(Vec::new()));
    }
    s.split(',')
        .map(|p| match p.trim().parse::<u32>() {
            Ok(0) | Err(_) => Err(ArgError::NotAPid(p.to_string())),
            Ok(v) => Ok(v),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(PidList)
}

fn parse_selector(s: &str) -> Result<DeviceSelector, ArgError> {
    DeviceSelector::parse(s).ok_or(ArgError::Selector)
}

/// The limits file as `limits show --json` prints it.
#[derive(Serialize)]
pub(crate) struct LimitsReport {
    schema: &'static str,
    limits_file: String,
    seq: u64,
    generation: u64,
    opt_out_allowed: bool,
    /// The agent's member host pids; `None` = no agent membership.
    members: Option<Vec<u32>>,
    /// The usage file the container is bound to; `None` = not bound.
    usage_file: Option<String>,
    /// The bound file's identity as recorded (text output only; the JSON schema predates it).
    #[serde(skip)]
    usage_id: Option<FileId>,
    /// Why the binding cannot be read (processes under this file then refuse to start); absent when it can.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_error: Option<String>,
    entries: Vec<LimitsEntry>,
}

/// One entry.
#[derive(Serialize)]
pub(crate) struct LimitsEntry {
    /// `all`, the ordinal or the UUID, as `--device` takes it.
    device: String,
    /// The CUDA ordinal of an ordinal entry.
    index: Option<u32>,
    /// The UUID of a UUID entry.
    uuid: Option<String>,
    memory_limit_bytes: Option<u64>,
    /// Guaranteed memory; absent = the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_request_bytes: Option<u64>,
    sm_limit_percent: Option<u32>,
    policy: &'static str,
    weight: Option<u32>,
    /// `high`, `low`, or none.
    priority: Option<&'static str>,
    /// Memory kept free for high-priority tenants.
    reserved_memory_bytes: Option<u64>,
}

impl LimitsReport {
    fn new(path: &Path, snap: &LimitsSnapshot) -> LimitsReport {
        LimitsReport {
            schema: SCHEMA,
            limits_file: path.display().to_string(),
            seq: snap.seq,
            generation: snap.generation,
            opt_out_allowed: snap.opt_out_allowed(),
            members: snap.members().map(<[u32]>::to_vec),
            usage_file: snap.usage_path().ok().flatten().map(|p| p.display().to_string()),
            usage_id: snap.usage_id().ok().flatten(),
            usage_error: snap.usage_path().err().map(|e| e.to_string()),
            entries: snap
                .entries
                .iter()
                .filter(|e| e.is_valid())
                .map(|e| {
                    let sel = e.selector();
                    let p = e.limits();
                    LimitsEntry {
                        device: sel.to_string(),
                        index: match sel {
                            DeviceSelector::Index(i) => Some(i),
                            _ => None,
                        },
                        uuid: match sel {
                            DeviceSelector::Uuid(u) => Some(format_uuid(&u)),
                            _ => None,
                        },
                        memory_limit_bytes: p.memory,
                        memory_request_bytes: p.memory_request,
                        sm_limit_percent: p.sm,
                        policy: p.kind.as_str(),
                        weight: p.weight,
                        priority: p.priority.map(Priority::as_str),
                        reserved_memory_bytes: p.reserved_memory,
                    }
                })
                .collect(),
        }
    }

    fn print(&self, json: bool) -> Result<(), CliError> {
        if json {
            return Ok(output::print_json(self)?);
        }
        println!(
            "{}: seq {}, generation {}, opt-out {}",
            self.limits_file,
            self.seq,
            self.generation,
            if self.opt_out_allowed {
                "allowed"
            } else {
                "forbidden"
            }
        );
        match &self.members {
            None => {
                println!("members: not published by the agent (NVML filtering falls back to the usage file)")
            }
            Some(m) if m.is_empty() => println!("members: published, none"),
            Some(m) => println!(
                "members: {} ({})",
                m.len(),
                m.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
        }
        if let Some(e) = &self.usage_error {
            println!("usage file: unreadable: {e}");
        }
        if let Some(u) = &self.usage_file {
            match &self.usage_id {
                Some(id) => println!(
                    "usage file: {u} (bound: processes use it whatever their environment says; only this \
                     file: {id})"
                ),
                None => println!(
                    "usage file: {u} (bound by path only: a file put in its place would be used; bind it again)"
                ),
            }
        }
        if self.entries.is_empty() {
            println!("(no entries: no limits from this file)");
            return Ok(());
        }
        let rows: Vec<[String; 8]> = self
            .entries
            .iter()
            .map(|e| {
                [
                    e.device.clone(),
                    output::size_or_dash(e.memory_limit_bytes),
                    // No request: the limit is guaranteed.
                    output::size_or_dash(e.memory_request_bytes.or(e.memory_limit_bytes)),
                    output::pct_or_dash(e.sm_limit_percent),
                    e.policy.into(),
                    e.weight.map_or_else(|| "-".into(), |w| w.to_string()),
                    e.priority.unwrap_or("-").into(),
                    output::size_or_dash(e.reserved_memory_bytes),
                ]
            })
            .collect();
        output::print_table(
            &[
                "DEVICE", "MEMORY", "REQUEST", "SM", "POLICY", "WEIGHT", "PRIORITY", "RESERVE",
            ],
            &rows,
        );
        Ok(())
    }
}

/// `cuquota limits …`.
pub(crate) fn run(cmd: LimitsCommand) -> CmdResult {
    match cmd {
        LimitsCommand::Init {
            file,
            no_opt_out,
            allow_opt_out,
        } => {
            let w = LimitsWriter::create(&file)?;
            if no_opt_out || allow_opt_out {
                w.update(|t| -> Result<(), CliError> {
                    set_opt_out(&mut t.flags, allow_opt_out);
                    Ok(())
                })??;
            }
            println!("{}: limits file ready", file.display());
        }
        LimitsCommand::Set(a) => {
            let snap = set(&a)?;
            LimitsReport::new(&a.file, &snap).print(a.json)?;
        }
        LimitsCommand::Clear { file, device, json } => {
            let w = LimitsWriter::open(&file)?;
            let snap = w.update(|t| {
                if t.remove(device) {
                    Ok(())
                } else {
                    Err(CliError::new(format!("no entry for device {device}")))
                }
            })??;
            LimitsReport::new(&file, &snap).print(json)?;
        }
        LimitsCommand::Members {
            file,
            set,
            clear,
            json,
        } => {
            if set.is_some() || clear {
                let w = LimitsWriter::open(&file)?;
                match set {
                    Some(PidList(pids)) => w.set_members(&pids)?,
                    None => w.clear_members()?,
                }
                LimitsReport::new(&file, &w.read()?).print(json)?;
            } else {
                let region = LimitsReader::open(&file)?;
                LimitsReport::new(&file, region.snapshot()).print(json)?;
            }
        }
        LimitsCommand::Show { file, json } => {
            // The read-only path, so `show` works on a read-only mount.
            let region = LimitsReader::open(&file)?;
            LimitsReport::new(&file, region.snapshot()).print(json)?;
        }
    }
    Ok(0)
}

/// Allows (`true`) or forbids opting out in a limits header's flags.
fn set_opt_out(flags: &mut u32, allowed: bool) {
    if allowed {
        *flags = (*flags | LIMITS_FLAG_OPT_OUT_ALLOWED) & !LIMITS_FLAG_NO_OPT_OUT;
    } else {
        *flags = (*flags | LIMITS_FLAG_NO_OPT_OUT) & !LIMITS_FLAG_OPT_OUT_ALLOWED;
    }
}

fn set(a: &SetArgs) -> Result<LimitsSnapshot, CliError> {
    if a.memory.is_none()
        && a.request.is_none()
        && a.sm.is_none()
        && a.policy.is_none()
        && a.weight.is_none()
        && a.priority.is_none()
        && a.reserve.is_none()
        && a.evict.is_none()
        && !a.no_opt_out
        && !a.allow_opt_out
        && a.usage.is_none()
    {
        return Err(CliError::new(
            "nothing to set: give --memory, --request, --sm, --policy, --weight, --priority, --reserve, \
             --evict, --no-opt-out/--allow-opt-out or --usage",
        ));
    }
    // The identity first, from the file opened (never blocking, following no link): nothing that can block or
    // fail on the tenant's file runs while the limits file's write lock is held.
    let usage = match a.usage.as_deref().filter(|u| u.as_os_str() != "none") {
        Some(p) => Some(usage_identity(p, a.usage_host.as_deref())?),
        None => None,
    };
    let w = LimitsWriter::open(&a.file)?;
    let snap = w.update(|t| -> Result<(), CliError> {
        let e = t.entry_mut(a.device)?;
        // Edited through the one Policy type; 0 means "no limit" / "the default", as in the file.
        let mut p: Policy = e.limits();
        if let Some(m) = a.memory {
            p.memory = (m != 0).then_some(m);
        }
        if let Some(r) = a.request {
            p.memory_request = (r != 0).then_some(r);
        }
        // The entry as it will be (a lower --memory counts too): a request above the cap, or without one, is
        // refused and nothing is written.
        p.check_request()
            .map_err(|e| CliError::new(format!("--request: device {}: {e}", a.device)))?;
        if let Some(s) = a.sm {
            p.sm = (s != 0).then_some(s);
        }
        if let Some(k) = a.policy {
            p.kind = k.kind();
        }
        if let Some(wt) = a.weight {
            p.weight = (wt != 0).then_some(wt);
        }
        if let Some(pr) = a.priority {
            p.priority = pr.priority();
        }
        if let Some(r) = a.reserve {
            p.reserved_memory = (r != 0).then_some(r);
        }
        e.raw = p.raw();
        if let Some(on) = a.evict {
            // The entry's bit (its index in the table, as the shim reads it).
            let i = t
                .entries
                .iter()
                .position(|e| e.is_valid() && e.selector() == a.device)
                .expect("entry_mut made it");
            t.evict_mask = match on {
                Switch::On => t.evict_mask | 1 << i,
                Switch::Off => t.evict_mask & !(1 << i),
            };
        }
        if a.no_opt_out || a.allow_opt_out {
            set_opt_out(&mut t.flags, a.allow_opt_out);
        }
        if let Some(u) = &a.usage {
            let bound = (u.as_os_str() != "none").then_some(u.as_path());
            t.set_usage(bound, usage)
                .map_err(|e| CliError::new(e.to_string()))?;
        }
        Ok(())
    })??;
    Ok(snap)
}

/// The identity of the usage file to bind (`container_path` as the container sees it; `host_path` the same
/// file here, created and initialised if missing). Without a host path, the container's path must name the
/// file here too, and it must exist: creating a file at a path meant for a container's mount namespace
/// would bind the wrong file.
fn usage_identity(container_path: &Path, host_path: Option<&Path>) -> Result<FileId, CliError> {
    let region = match host_path {
        Some(h) => {
            UsageRegion::open_for_binding(h, true).map_err(|e| CliError::new(format!("usage file: {e}")))?
        }
        None => UsageRegion::open_for_binding(container_path, false).map_err(|e| {
            CliError::new(format!(
                "usage file: {e}: binding records the file's identity, so it must exist here; if the \
                 container sees a host file under another path, give that file with --usage-host HOST_PATH"
            ))
        })?,
    };
    region.file_id().ok_or_else(|| {
        CliError::new(format!(
            "usage file {}: its identity cannot be read (statx and fstat failed)",
            region.path().display()
        ))
    })
}

/// Writes `memory` / `sm` / `policy` for `all` devices into `file` (created if missing): what `cuquota run`
/// and the demo do for a tenant.
pub(crate) fn write_all(
    file: &Path,
    memory: Option<u64>,
    sm: Option<u32>,
    policy: Option<PolicyArg>,
) -> Result<(), CliError> {
    let w = LimitsWriter::create(file)?;
    w.update(|t| -> Result<(), CliError> {
        let e = t.entry_mut(DeviceSelector::All)?;
        let p = Policy {
            memory: memory.filter(|m| *m != 0),
            sm: sm.filter(|s| *s != 0),
            kind: policy.map_or(PolicyKind::Default, PolicyArg::kind),
            ..e.limits()
        };
        p.check_request().map_err(|e| CliError::new(e.to_string()))?;
        e.raw = p.raw();
        Ok(())
    })??;
    Ok(())
}
