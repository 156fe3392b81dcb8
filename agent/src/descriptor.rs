//! Container descriptors: `DIR/<name>.toml`, one per container, re-read every pass (containers come and go).
//!
//! ```toml
//! name = "web-0"                         # optional; must equal the file's stem when given
//! namespace = "default"                  # optional metric labels (blank when absent)
//! pod = "web-0"
//! container = "server"
//! limits = "/var/lib/cuquota/web-0/limits"   # required: the agent-owned limits file
//! usage = "/var/lib/cuquota/web-0/usage"     # optional: the container's usage file
//! [members]                              # exactly one of:
//! cgroup = "/sys/fs/cgroup/kubepods/…"   #   every process in this cgroup directory and its sub-cgroups
//! # pidns = "/proc/1234/ns/pid"          #   every process in this pid namespace (or one nested in it)
//! # subtree = 1234                       #   this process and every descendant (a child subreaper),
//! # subtree_start = 5678                 #   with its start time: /proc/1234/stat field 22 when written
//! [enforce]                              # optional
//! memory = "report"                      # or "kill": SIGKILL the largest processes while over the cap
//! sm = "report"                          # or "throttle": freeze/thaw to hold the share at the limit
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::members::MemberSource;

/// What to do when a container uses more memory than its cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryPolicy {
    /// Report only.
    #[default]
    Report,
    /// SIGKILL the container's largest GPU-memory processes while it is over the cap.
    Kill,
}

/// What to do when a container uses more SM time than its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmPolicy {
    /// Report only.
    #[default]
    Report,
    /// Freeze and thaw the container's processes to bring its share back to the limit.
    Throttle,
}

/// `[enforce]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enforce {
    /// Memory over the cap.
    #[serde(default)]
    pub memory: MemoryPolicy,
    /// SM share over the limit.
    #[serde(default)]
    pub sm: SmPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMembers {
    cgroup: Option<PathBuf>,
    pidns: Option<PathBuf>,
    subtree: Option<u32>,
    subtree_start: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Option<String>,
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
    limits: PathBuf,
    usage: Option<PathBuf>,
    members: RawMembers,
    #[serde(default)]
    enforce: Enforce,
}

/// A validated descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The container's id (the file's stem).
    pub name: String,
    /// Kubernetes namespace (metric label).
    pub namespace: String,
    /// Pod (metric label).
    pub pod: String,
    /// Container (metric label).
    pub container: String,
    /// The agent-owned limits file.
    pub limits: PathBuf,
    /// The container's usage file, if the agent may read it.
    pub usage: Option<PathBuf>,
    /// How its processes are known.
    pub members: MemberSource,
    /// What to do over the limits.
    pub enforce: Enforce,
}

/// Why a descriptor is refused (the container is reported with it, and judged by nobody).
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// Not TOML, or a key missing, unknown or of the wrong type (toml's message names it).
    #[error("{0}")]
    Toml(String),
    /// `name` is not the file's name.
    #[error("name = {name:?} differs from the file name {stem:?}.toml")]
    NameDiffers {
        /// `name =`.
        name: String,
        /// The file's name without `.toml`.
        stem: String,
    },
    /// `subtree_start` without `subtree`.
    #[error("[members] subtree_start is only for subtree")]
    StartWithoutSubtree,
    /// `subtree = 0`.
    #[error("[members] subtree = 0 is not a process")]
    SubtreeZero,
    /// None or several of the member sources.
    #[error("[members] needs exactly one of cgroup, pidns, subtree")]
    MemberSource,
    /// `limits` or `usage` relative.
    #[error("{what} = {path:?} must be an absolute path")]
    RelativePath {
        /// `limits` or `usage`.
        what: &'static str,
        /// The path given.
        path: String,
    },
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] std::io::Error),
}

/// The descriptor directory could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", .dir.display())]
pub struct ScanError {
    /// `--containers`.
    pub dir: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// Parses one descriptor; `stem` is the file's name without `.toml`.
pub fn parse(stem: &str, text: &str) -> Result<Descriptor, DescriptorError> {
    let raw: Raw = toml::from_str(text).map_err(|e| DescriptorError::Toml(e.message().to_string()))?;
    if let Some(n) = &raw.name {
        if n != stem {
            return Err(DescriptorError::NameDiffers {
                name: n.clone(),
                stem: stem.to_string(),
            });
        }
    }
    let m = raw.members;
    if m.subtree.is_none() && m.subtree_start.is_some() {
        return Err(DescriptorError::StartWithoutSubtree);
    }
    // Without subtree_start (an older writer) the descriptor parses, but no process is confirmed as its root
    // (members.rs): the container is reported with that error and judged by nobody.
    let members = match (m.cgroup, m.pidns, m.subtree) {
        (Some(c), None, None) => MemberSource::Cgroup(c),
        (None, Some(p), None) => MemberSource::PidNs(p),
        (None, None, Some(0)) => return Err(DescriptorError::SubtreeZero),
        (None, None, Some(root)) => MemberSource::Subtree {
            root,
            start: m.subtree_start,
        },
        _ => return Err(DescriptorError::MemberSource),
    };
    for (what, p) in [("limits", Some(&raw.limits)), ("usage", raw.usage.as_ref())] {
        if let Some(p) = p {
            if !p.is_absolute() {
                return Err(DescriptorError::RelativePath {
                    what,
                    path: p.display().to_string(),
                });
            }
        }
    }
    Ok(Descriptor {
        name: stem.to_string(),
        namespace: raw.namespace.unwrap_or_default(),
        pod: raw.pod.unwrap_or_default(),
        container: raw.container.unwrap_or_default(),
        limits: raw.limits,
        usage: raw.usage,
        members,
        enforce: raw.enforce,
    })
}

/// One file of the directory: (stem, path, the descriptor or why not).
pub type Found = (String, PathBuf, Result<Descriptor, DescriptorError>);

/// Every `*.toml` in `dir`, sorted by name.
pub fn scan(dir: &Path) -> Result<Vec<Found>, ScanError> {
    let rd = std::fs::read_dir(dir).map_err(|source| ScanError {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else {
            continue;
        };
        if stem.starts_with('.') {
            continue; // an editor's or a writer's temporary file
        }
        let d = std::fs::read_to_string(&path)
            .map_err(DescriptorError::from)
            .and_then(|t| parse(&stem, &t));
        out.push((stem, path, d));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
        namespace = "default"
        pod = "web-0"
        container = "server"
        limits = "/var/lib/cuquota/web-0/limits"
        usage = "/var/lib/cuquota/web-0/usage"
        [members]
        subtree = 1234
        subtree_start = 5678
        [enforce]
        memory = "report"
    "#;

    #[test]
    fn a_full_descriptor() {
        let d = parse("web-0", OK).unwrap();
        assert_eq!(d.name, "web-0");
        assert_eq!(
            (d.namespace.as_str(), d.pod.as_str(), d.container.as_str()),
            ("default", "web-0", "server")
        );
        assert_eq!(
            d.members,
            MemberSource::Subtree {
                root: 1234,
                start: Some(5678)
            }
        );
        let old = parse("web-0", &OK.replace("subtree_start = 5678", "")).unwrap();
        assert_eq!(
            old.members,
            MemberSource::Subtree {
                root: 1234,
                start: None
            }
        );
        assert_eq!(d.enforce, Enforce::default());
        assert_eq!(
            d.usage.as_deref(),
            Some(Path::new("/var/lib/cuquota/web-0/usage"))
        );
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            (
                OK.replace("subtree = 1234", "subtree = 1234\ncgroup = \"/x\""),
                "exactly one",
            ),
            (
                OK.replace("subtree = 1234", "")
                    .replace("subtree_start = 5678", ""),
                "exactly one",
            ),
            (OK.replace("subtree = 1234", "subtree = 0"), "not a process"),
            (
                OK.replace("subtree = 1234", "cgroup = \"/x\""),
                "only for subtree",
            ),
            (OK.replace("subtree_start = 5678", "subtree_start = -1"), "`-1`"),
            (OK.replace("pod = ", "pdo = "), "pdo"),
            (OK.replace("memory = \"report\"", "memory = \"shout\""), "shout"),
            (
                OK.replace("/var/lib/cuquota/web-0/limits", "limits.bin"),
                "absolute",
            ),
            (
                OK.replace("limits = \"/var/lib/cuquota/web-0/limits\"", ""),
                "limits",
            ),
            (format!("name = \"other\"\n{OK}"), "differs"),
            (OK.replace("memory = \"report\"", "sm = \"freeze\""), "freeze"),
        ];
        for (text, word) in cases {
            let e = parse("web-0", &text).expect_err(&text);
            assert!(e.to_string().contains(word), "{word}: {e}");
        }
    }

    #[test]
    fn enforcement_policies() {
        let d = parse(
            "a",
            &OK.replace("memory = \"report\"", "memory = \"kill\"\nsm = \"throttle\""),
        )
        .unwrap();
        assert_eq!(
            d.enforce,
            Enforce {
                memory: MemoryPolicy::Kill,
                sm: SmPolicy::Throttle
            }
        );
    }

    #[test]
    fn other_member_sources() {
        let ok = OK.replace("subtree_start = 5678", "");
        let d = parse("a", &ok.replace("subtree = 1234", "pidns = \"/proc/1/ns/pid\"")).unwrap();
        assert_eq!(d.members, MemberSource::PidNs("/proc/1/ns/pid".into()));
        let d = parse(
            "a",
            &ok.replace("subtree = 1234", "cgroup = \"/sys/fs/cgroup/k\""),
        )
        .unwrap();
        assert_eq!(d.members, MemberSource::Cgroup("/sys/fs/cgroup/k".into()));
    }
}
