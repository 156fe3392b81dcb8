//! What upstream's kubelet and API send that the plugin must answer as upstream's drivers do: a device held
//! under several share IDs (consumable capacity), subrequests (`firstAvailable`: `req/sub`), and pods joining
//! a shared claim (`reservedFor` grows).

mod common;

use common::{fixture, Node, GPU, POD_UID, UID};
use cuquota_core::region::layout::parse_uuid;
use cuquota_core::region::{DeviceSelector, LimitsReader};

const SHARE_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const SHARE_B: &str = "11111111-2222-3333-4444-555555555555";

/// The fixture with its one result twice on the same GPU: (share ID, memory, sm) each.
fn shared_twice(uid: &str, a: (&str, &str, &str), b: (&str, &str, &str)) -> serde_json::Value {
    let mut v = fixture();
    v["metadata"]["uid"] = uid.into();
    let results = &mut v["status"]["allocation"]["devices"]["results"];
    let mut second = results[0].clone();
    second["request"] = "second".into();
    for (r, (share, mem, sm)) in [(&mut results[0], a), (&mut second, b)] {
        r["shareID"] = share.into();
        r["consumedCapacity"] = serde_json::json!({"memory": mem, "sm": sm});
    }
    results.as_array_mut().unwrap().push(second);
    // The same configuration for both requests (the GPU has one limits entry).
    v["status"]["allocation"]["devices"]["config"][0]["requests"] = serde_json::json!([]);
    v
}

fn gpu_limits(n: &Node, uid: &str) -> (Option<u64>, Option<u32>) {
    let snap = *LimitsReader::open(&n.p(&format!("state/claims/{uid}/limits")))
        .unwrap()
        .snapshot();
    let e = snap
        .get(DeviceSelector::Uuid(parse_uuid(GPU).unwrap()))
        .unwrap()
        .limits();
    (e.memory, e.sm)
}

#[test]
fn a_gpu_held_under_two_share_ids_is_two_devices_of_one_gpu_capped_at_their_sum() {
    let n = Node::new();
    let uid = "44444444-0000-0000-0000-000000000001";
    n.put_claim(
        "pair",
        &shared_twice(uid, (SHARE_A, "4Gi", "30"), (SHARE_B, "2Gi", "20")),
    );
    let r = n.prepare(&[("pair", uid)]);
    let c = &r[uid];
    assert_eq!(c.error, "", "{c:?}");
    // Two devices of one GPU, each with its share ID (field 5); the claim's CDI device on the first.
    assert_eq!(c.devices.len(), 2, "{c:?}");
    assert!(c.devices.iter().all(|d| d.device_name == GPU.to_lowercase()));
    assert_eq!(
        c.devices
            .iter()
            .map(|d| d.share_id.as_deref())
            .collect::<Vec<_>>(),
        [Some(SHARE_A), Some(SHARE_B)]
    );
    assert_eq!(c.devices[0].cdi_device_ids, [format!("cuquota.io/gpu={uid}")]);
    assert_eq!(c.devices[0].request_names, ["gpu", "second"]);
    // The pair's capacities together: one limits entry.
    assert_eq!(gpu_limits(&n, uid), (Some(6 << 30), Some(50)));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n.layout.cdi_spec_path(uid)).unwrap()).unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    assert!(
        env.contains(&format!("\"CUDA_VISIBLE_DEVICES={GPU}\""))
            && env.contains("CUDA_DEVICE_MEMORY_LIMIT_0=6144m"),
        "{env}"
    );
    assert!(!env.contains("LIMIT_1"), "one GPU, not two: {env}");
    // The checkpoint keeps the share IDs: the answer after a restart is the same.
    let cp = std::fs::read_to_string(n.p(&format!("state/claims/{uid}/prepared.json"))).unwrap();
    assert!(cp.contains(SHARE_B), "{cp}");
    assert_eq!(n.prepare(&[("pair", uid)])[uid], *c);
}

#[test]
fn shares_of_one_gpu_beyond_it_or_without_distinct_share_ids_are_refused() {
    let n = Node::new();
    let cases = [
        (
            (SHARE_A, "4Gi", "60"),
            (SHARE_B, "2Gi", "50"),
            "110 % of its SM time",
        ),
        (
            (SHARE_A, "60Gi", "30"),
            (SHARE_B, "30Gi", "20"),
            "consume 96636764160 bytes",
        ),
        (
            (SHARE_A, "4Gi", "30"),
            (SHARE_A, "2Gi", "20"),
            "without distinct share IDs",
        ),
    ];
    for (i, (a, b, want)) in cases.into_iter().enumerate() {
        let uid = format!("44444444-0000-0000-0000-00000000010{i}");
        n.put_claim("over", &shared_twice(&uid, a, b));
        let r = n.prepare(&[("over", &uid)]);
        assert!(r[&uid].error.contains(want), "case {i}: {:?}", r[&uid]);
        assert!(!n.layout.cdi_spec_path(&uid).exists());
    }
    // Different configurations on the two shares: one limits entry cannot hold both.
    let uid = "44444444-0000-0000-0000-000000000110";
    let mut v = shared_twice(uid, (SHARE_A, "4Gi", "30"), (SHARE_B, "2Gi", "20"));
    v["status"]["allocation"]["devices"]["config"][0]["requests"] = serde_json::json!(["gpu"]);
    n.put_claim("split", &v);
    let r = n.prepare(&[("split", uid)]);
    assert!(r[uid].error.contains("different configurations"), "{:?}", r[uid]);
}

#[test]
fn a_subrequest_is_answered_under_its_parent_request() {
    let n = Node::new();
    let mut v = fixture();
    let uid = "55555555-0000-0000-0000-000000000001";
    v["metadata"]["uid"] = uid.into();
    v["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu/small".into();
    n.put_claim("sub", &v);
    let r = n.prepare(&[("sub", uid)]);
    assert_eq!(r[uid].error, "", "{:?}", r[uid]);
    // A container names `gpu` in resources.claims[].request: the kubelet matches that to request_names.
    assert_eq!(r[uid].devices[0].request_names, ["gpu"]);
    // The claim's configuration for `gpu` applies to its subrequest.
    assert_eq!(gpu_limits(&n, uid), (Some(4 << 30), Some(30)));
}

#[test]
fn a_pod_joining_a_shared_claim_gets_its_descriptor() {
    let n = Node::new();
    let joiner = "bbbbcccc-dddd-eeee-ffff-000011112222";
    for pod in [POD_UID, joiner] {
        std::fs::create_dir_all(n.p(&format!("cgroup/kubepods/burstable/pod{pod}"))).unwrap();
    }
    let desc = |pod: &str| n.p(&format!("agent/dra-{UID}-{pod}.toml"));
    let first = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(first[UID].error, "");
    assert!(desc(POD_UID).is_file(), "control: the first pod's descriptor");
    assert!(!desc(joiner).exists());

    // A second pod reserves the claim; the kubelet prepares it again for that pod.
    let mut v = fixture();
    v["status"]["reservedFor"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"resource": "pods", "name": "notebook-1", "uid": joiner}));
    n.put_claim("notebook-gpu", &v);
    let again = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(again, first, "the same devices");
    let text = std::fs::read_to_string(desc(joiner)).expect("the joining pod's descriptor");
    assert!(text.contains("pod = \"notebook-1\""), "{text}");
    assert!(desc(POD_UID).is_file());
    // The first pod ends (no longer reserved); the claim is prepared again for another: its descriptor goes.
    v["status"]["reservedFor"].as_array_mut().unwrap().remove(0);
    n.put_claim("notebook-gpu", &v);
    assert_eq!(n.prepare(&[("notebook-gpu", UID)]), first);
    assert!(!desc(POD_UID).exists(), "the ended pod's descriptor");
    assert!(desc(joiner).is_file());
    std::fs::write(desc(POD_UID), b"").unwrap();
    // Unprepare removes both.
    assert_eq!(n.unprepare(UID), "");
    assert!(!desc(joiner).exists() && !desc(POD_UID).exists());
}
