//! Where the built libraries are: `libcuquota.so` (the shim) and `libcudasim.so` (the simulated GPU).
//!
//! Looked for next to the `cuquota` binary (a cargo build: `target/<profile>/`), then in an installed layout
//! (`<prefix>/lib/cuquota/`, `<prefix>/lib/`, `/usr/local/lib/cuquota/`, `/usr/lib/cuquota/`). A binary built
//! from a source checkout that finds neither builds them there once with cargo (`cargo run -p cuquota-cli --
//! demo` on a fresh checkout works without a separate build step).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::CliError;

/// The shim.
pub(crate) const SHIM: &str = "libcuquota.so";
/// The simulated driver.
pub(crate) const SIMULATOR: &str = "libcudasim.so";

/// The workspace this binary was built from, if its sources are still there.
pub(crate) fn source_checkout() -> Option<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.to_path_buf();
    (ws.join("Cargo.toml").is_file() && ws.join("src/lib.rs").is_file() && ws.join("shim-tests/sim").is_dir())
        .then_some(ws)
}

fn exe_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .canonicalize()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

fn installed_candidates(name: &str) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(d) = exe_dir() {
        c.push(d.join(name));
        if let Some(prefix) = d.parent() {
            c.push(prefix.join("lib/cuquota").join(name));
            c.push(prefix.join("lib").join(name));
        }
    }
    c.push(Path::new("/usr/local/lib/cuquota").join(name));
    c.push(Path::new("/usr/lib/cuquota").join(name));
    c
}

/// The cargo profile directory this binary sits in, when it is a cargo build: (target dir, profile name).
fn own_profile() -> Option<(PathBuf, String)> {
    let d = exe_dir()?;
    let target = d.parent()?;
    if !target.join("CACHEDIR.TAG").is_file() {
        return None;
    }
    Some((
        target.to_path_buf(),
        d.file_name()?.to_string_lossy().into_owned(),
    ))
}

/// Builds the shim and the simulator in the source checkout with the binary's own profile (release when the
/// binary is not inside the checkout's target dir). Returns the directory they are in.
fn build_in_checkout(ws: &Path) -> Result<PathBuf, CliError> {
    let (target, profile) = own_profile().unwrap_or_else(|| (ws.join("target"), "release".into()));
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(ws)
        .args(["build", "-p", "cuquota", "-p", "cuquota-sim"]);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            c.arg("--release");
        }
        p => {
            c.args(["--profile", p]);
        }
    }
    c.env("CARGO_TARGET_DIR", &target);
    eprintln!(
        "cuquota: building {SHIM} and {SIMULATOR} in {} ({profile}; first use only)…",
        ws.display()
    );
    let st = c
        .status()
        .map_err(|e| CliError::new(format!("cannot run cargo to build {SHIM}: {e}")))?;
    if !st.success() {
        return Err(CliError::new(format!(
            "`cargo build -p cuquota -p cuquota-sim` failed in {} ({st})",
            ws.display()
        )));
    }
    Ok(target.join(profile))
}

/// Finds `name` (`SHIM` or `SIMULATOR`): `explicit` if given, else the candidates, else a build in the source
/// checkout.
pub(crate) fn library(name: &str, explicit: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
        } else {
            Err(CliError::new(format!("{}: no such file", p.display())))
        };
    }
    let cands = installed_candidates(name);
    if let Some(p) = cands.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    if let Some(ws) = source_checkout() {
        let p = build_in_checkout(&ws)?.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    let looked: Vec<String> = cands.iter().map(|p| p.display().to_string()).collect();
    Err(CliError::new(format!(
        "{name} not found (looked in {}); build it with `cargo build --release --workspace` or pass its path",
        looked.join(", ")
    )))
}
