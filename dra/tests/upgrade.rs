//! Rolling upgrades: a new plugin takes over the claims an older one prepared, from their checkpoints
//! (`claims/U/prepared.json`). The fixture core/tests/fixtures/upgrade-315d850/dra-prepared.json is the
//! checkpoint layout the plugin has written since it was merged (da84b33; commit 315d850 had no plugin).

mod common;

use common::{Node, GPU, UID};

#[test]
fn a_new_plugin_reads_an_old_checkpoint_and_answers_and_unprepares_from_it() {
    let node = Node::new();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/upgrade-315d850/dra-prepared.json");
    let dir = node.layout.state_dir.join(format!("claims/{UID}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&fixture, dir.join("prepared.json")).unwrap();

    let p = node
        .layout
        .prepared(UID)
        .expect("the old checkpoint does not parse");
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        ("team-a", "notebook-gpu")
    );
    let g = &p.grants.devices[0];
    assert_eq!((g.uuid.as_str(), g.memory, g.sm), (GPU, 4 << 30, Some(30)));
    assert_eq!((g.policy.as_str(), g.priority.as_deref()), ("hard", Some("low")));
    assert_eq!(g.reserved_memory, Some(1 << 30));

    // The kubelet asks again after the upgrade: the same grant, answered from the checkpoint.
    let r = node.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    assert_eq!(
        r[UID].devices[0].cdi_device_ids,
        [format!("cuquota.io/gpu={UID}")]
    );
    assert_eq!(node.unprepare(UID), "");
    assert!(!dir.exists(), "unprepare left {}", dir.display());
}
