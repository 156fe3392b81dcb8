//! Rolling upgrades: a new agent reads the descriptors written for the agent of commit 315d850
//! (core/tests/fixtures/upgrade-315d850/web-0.toml: every field that layout had).

use cuquota_agent::descriptor::{parse, MemoryPolicy, SmPolicy};
use cuquota_agent::members::MemberSource;

#[test]
fn a_new_agent_reads_an_old_descriptor() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/upgrade-315d850/web-0.toml");
    let d = parse("web-0", &std::fs::read_to_string(p).unwrap()).expect("the old descriptor is refused");
    assert_eq!(
        (d.namespace.as_str(), d.pod.as_str(), d.container.as_str()),
        ("default", "web-0", "server")
    );
    assert_eq!(d.limits, std::path::Path::new("/var/lib/cuquota/web-0/limits"));
    assert_eq!(
        d.usage.as_deref(),
        Some(std::path::Path::new("/var/lib/cuquota/web-0/usage"))
    );
    assert_eq!(
        d.members,
        MemberSource::Cgroup("/sys/fs/cgroup/kubepods/pod0badc0de/web-0".into())
    );
    assert_eq!(
        (d.enforce.memory, d.enforce.sm),
        (MemoryPolicy::Kill, SmPolicy::Throttle)
    );
}
