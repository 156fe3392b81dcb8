//! `cuquota limits …`: create, edit and show the agent's limits file. Edits go through the seqlock, so running
//! processes pick them up at their next check without restarting.

use std::path::PathBuf;

use cuquota_core::region::layout::{
    LIMITS_FLAG_NO_OPT_OUT, POLICY_BURST, POLICY_DEFAULT, POLICY_DISABLED, POLICY_HARD,
};
use cuquota_core::region::{DeviceSelector, LimitsSnapshot, LimitsWriter};
use cuquota_core::units::{format_size, parse_size, parse_unsigned};

use crate::args::Args;
use crate::{json, CliError};

/// `limits init <file> [--no-opt-out]`
pub fn init(mut a: Args) -> Result<(), CliError> {
    let no_opt_out = a.flag("no-opt-out");
    let path = PathBuf::from(a.positional("limits file")?);
    a.finish()?;
    let w = LimitsWriter::create(&path)?;
    if no_opt_out {
        w.update(|t| -> Result<(), CliError> {
            t.flags |= LIMITS_FLAG_NO_OPT_OUT;
            Ok(())
        })??;
    }
    println!("{}: limits file ready", path.display());
    Ok(())
}

fn parse_policy(s: &str) -> Result<u32, CliError> {
    match s.to_ascii_lowercase().as_str() {
        "default" => Ok(POLICY_DEFAULT),
        "hard" => Ok(POLICY_HARD),
        "burst" => Ok(POLICY_BURST),
        "disabled" | "disable" => Ok(POLICY_DISABLED),
        _ => Err(CliError(format!(
            "--policy {s:?}: expected default, hard, burst or disabled"
        ))),
    }
}

fn policy_name(p: u32) -> &'static str {
    match p {
        POLICY_HARD => "hard",
        POLICY_BURST => "burst",
        POLICY_DISABLED => "disabled",
        _ => "default",
    }
}

fn device_arg(a: &mut Args) -> Result<DeviceSelector, CliError> {
    let d = a
        .value("device")?
        .ok_or_else(|| CliError("--device is required (all, an index or a GPU UUID)".into()))?;
    DeviceSelector::parse(&d).ok_or_else(|| {
        CliError(format!(
            "--device {d:?}: expected all, a CUDA ordinal or a GPU-… UUID"
        ))
    })
}

/// `limits set <file> --device D [--memory S] [--sm P] [--policy X] [--weight N] [--no-opt-out|--allow-opt-out]`
pub fn set(mut a: Args) -> Result<(), CliError> {
    let sel = device_arg(&mut a)?;
    let memory = a
        .value("memory")?
        .map(|m| {
            parse_size(&m).map_err(|e| CliError(format!("--memory {m:?}: {e}; expected e.g. 4g or 3000m")))
        })
        .transpose()?;
    let sm = a
        .value("sm")?
        .map(|s| match parse_unsigned(&s) {
            Ok(n) if n <= 100 => Ok(if n == 100 { 0 } else { n as u32 }),
            _ => Err(CliError(format!(
                "--sm {s:?}: expected a percentage from 0 to 100 (0/100 = no limit)"
            ))),
        })
        .transpose()?;
    let policy = a.value("policy")?.map(|p| parse_policy(&p)).transpose()?;
    let weight = a
        .value("weight")?
        .map(|w| match parse_unsigned(&w) {
            Ok(n) if n <= 1000 => Ok(n as u32),
            _ => Err(CliError(format!(
                "--weight {w:?}: expected 1 to 1000 (0 = default)"
            ))),
        })
        .transpose()?;
    let no_opt_out = a.flag("no-opt-out");
    let allow_opt_out = a.flag("allow-opt-out");
    let path = PathBuf::from(a.positional("limits file")?);
    a.finish()?;
    if no_opt_out && allow_opt_out {
        return Err(CliError(
            "--no-opt-out and --allow-opt-out contradict each other".into(),
        ));
    }
    if memory.is_none()
        && sm.is_none()
        && policy.is_none()
        && weight.is_none()
        && !no_opt_out
        && !allow_opt_out
    {
        return Err(CliError(
            "nothing to set: give --memory, --sm, --policy or --weight".into(),
        ));
    }
    let w = LimitsWriter::open(&path)?;
    let snap = w.update(|t| -> Result<(), CliError> {
        let e = t.entry_mut(sel)?;
        if let Some(m) = memory {
            e.memory_limit = m;
        }
        if let Some(s) = sm {
            e.sm_limit = s;
        }
        if let Some(p) = policy {
            e.policy = p;
        }
        if let Some(wt) = weight {
            e.weight = wt;
        }
        if no_opt_out {
            t.flags |= LIMITS_FLAG_NO_OPT_OUT;
        }
        if allow_opt_out {
            t.flags &= !LIMITS_FLAG_NO_OPT_OUT;
        }
        Ok(())
    })??;
    print_table(&path, &snap);
    Ok(())
}

/// `limits clear <file> --device D`
pub fn clear(mut a: Args) -> Result<(), CliError> {
    let sel = device_arg(&mut a)?;
    let path = PathBuf::from(a.positional("limits file")?);
    a.finish()?;
    let w = LimitsWriter::open(&path)?;
    let snap = w.update(|t| {
        if t.remove(sel) {
            Ok(())
        } else {
            Err(CliError(format!("no entry for device {sel}")))
        }
    })??;
    print_table(&path, &snap);
    Ok(())
}

/// `limits show <file> [--json]`
pub fn show(mut a: Args) -> Result<(), CliError> {
    let as_json = a.flag("json");
    let path = PathBuf::from(a.positional("limits file")?);
    a.finish()?;
    // Read-write open is not needed to read, but the writer's read waits for a live writer; a reader mapping
    // would do too. Prefer the read-only path so `show` works on a read-only mount.
    let region = cuquota_core::region::LimitsReader::open(&path)?;
    let snap = *region.snapshot();
    if as_json {
        println!("{}", to_json(&path, &snap));
    } else {
        print_table(&path, &snap);
    }
    Ok(())
}

fn print_table(path: &std::path::Path, snap: &LimitsSnapshot) {
    println!(
        "{}: seq {}, generation {}, opt-out {}",
        path.display(),
        snap.seq,
        snap.generation,
        if snap.opt_out_allowed() {
            "allowed"
        } else {
            "forbidden"
        }
    );
    let rows: Vec<[String; 5]> = snap
        .entries
        .iter()
        .filter(|e| e.is_valid())
        .map(|e| {
            [
                e.selector().to_string(),
                if e.memory_limit == 0 {
                    "-".into()
                } else {
                    format_size(e.memory_limit)
                },
                if e.sm_limit == 0 {
                    "-".into()
                } else {
                    format!("{}%", e.sm_limit)
                },
                policy_name(e.policy).into(),
                if e.weight == 0 {
                    "-".into()
                } else {
                    e.weight.to_string()
                },
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("(no entries: no limits from this file)");
        return;
    }
    crate::status::print_rows(&["DEVICE", "MEMORY", "SM", "POLICY", "WEIGHT"], &rows);
}

fn to_json(path: &std::path::Path, snap: &LimitsSnapshot) -> String {
    let entries: Vec<String> = snap
        .entries
        .iter()
        .filter(|e| e.is_valid())
        .map(|e| {
            json::object(&[
                ("device", json::string(&e.selector().to_string())),
                (
                    "memory_limit",
                    json::opt((e.memory_limit != 0).then_some(e.memory_limit)),
                ),
                ("sm_limit", json::opt((e.sm_limit != 0).then_some(e.sm_limit))),
                ("policy", json::string(policy_name(e.policy))),
                ("weight", json::opt((e.weight != 0).then_some(e.weight))),
            ])
        })
        .collect();
    json::object(&[
        ("file", json::string(&path.display().to_string())),
        ("seq", snap.seq.to_string()),
        ("generation", snap.generation.to_string()),
        ("opt_out_allowed", snap.opt_out_allowed().to_string()),
        ("entries", json::array(&entries)),
    ])
}
