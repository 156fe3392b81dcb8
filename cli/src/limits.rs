//! `cuquota limits …`: create, edit and show the agent's limits file. Edits go through the seqlock, so running
//! processes pick them up at their next check without restarting.

use std::path::PathBuf;

use cuquota_core::region::layout::LIMITS_FLAG_NO_OPT_OUT;
use cuquota_core::region::{DeviceSelector, LimitsSnapshot, LimitsWriter};
use cuquota_core::units::{format_size, parse_size, parse_unsigned};
use cuquota_core::{Policy, PolicyKind, Priority};

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

fn parse_policy(s: &str) -> Result<PolicyKind, CliError> {
    PolicyKind::parse(s).ok_or_else(|| {
        CliError(format!(
            "--policy {s:?}: expected default, hard, burst or disabled"
        ))
    })
}

/// `--priority`: `high`, `low` (HAMi's `0`, `1`), or `none` to clear it.
fn parse_priority(s: &str) -> Result<Option<Priority>, CliError> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    Priority::parse(s)
        .map(Some)
        .ok_or_else(|| CliError(format!("--priority {s:?}: expected high, low or none")))
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

/// `limits set <file> --device D [--memory S] [--sm P] [--policy X] [--weight N] [--priority high|low|none]
/// [--no-opt-out|--allow-opt-out]`
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
    let priority = a.value("priority")?.map(|p| parse_priority(&p)).transpose()?;
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
        && priority.is_none()
        && !no_opt_out
        && !allow_opt_out
    {
        return Err(CliError(
            "nothing to set: give --memory, --sm, --policy, --weight or --priority".into(),
        ));
    }
    let w = LimitsWriter::open(&path)?;
    let snap = w.update(|t| -> Result<(), CliError> {
        let e = t.entry_mut(sel)?;
        // 0 = no limit / the default, as in the file.
        let mut p: Policy = e.limits();
        if let Some(m) = memory {
            p.memory = (m != 0).then_some(m);
        }
        if let Some(s) = sm {
            p.sm = (s != 0).then_some(s);
        }
        if let Some(k) = policy {
            p.kind = k;
        }
        if let Some(wt) = weight {
            p.weight = (wt != 0).then_some(wt);
        }
        if let Some(pr) = priority {
            p.priority = pr;
        }
        e.raw = p.raw();
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
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let rows: Vec<[String; 6]> = snap
        .entries
        .iter()
        .filter(|e| e.is_valid())
        .map(|e| {
            let p = e.limits();
            [
                e.selector().to_string(),
                dash(p.memory.map(format_size)),
                dash(p.sm.map(|s| format!("{s}%"))),
                p.kind.as_str().into(),
                dash(p.weight.map(|w| w.to_string())),
                dash(p.priority.map(|pr| pr.as_str().into())),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("(no entries: no limits from this file)");
        return;
    }
    crate::status::print_rows(&["DEVICE", "MEMORY", "SM", "POLICY", "WEIGHT", "PRIORITY"], &rows);
}

fn to_json(path: &std::path::Path, snap: &LimitsSnapshot) -> String {
    let entries: Vec<String> = snap
        .entries
        .iter()
        .filter(|e| e.is_valid())
        .map(|e| {
            let p = e.limits();
            json::object(&[
                ("device", json::string(&e.selector().to_string())),
                ("memory_limit", json::opt(p.memory)),
                ("sm_limit", json::opt(p.sm)),
                ("policy", json::string(p.kind.as_str())),
                ("weight", json::opt(p.weight)),
                (
                    "priority",
                    p.priority
                        .map_or_else(|| "null".into(), |pr| json::string(pr.as_str())),
                ),
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
