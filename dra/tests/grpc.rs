//! The plugin as the kubelet sees it: a client over the real gRPC APIs on unix sockets (registration GetInfo,
//! NodePrepareResources, NodeUnprepareResources), and the files a prepared claim leaves on the node.

mod common;

use std::path::Path;

use common::{fixture, Node, GPU, POD_UID, UID};
use cuquota_core::region::layout::parse_uuid;
use cuquota_core::region::{DeviceSelector, LimitsReader};
use cuquota_core::PolicyKind;
use cuquota_dra::proto::registration::registration_client::RegistrationClient;
use cuquota_dra::proto::registration::InfoRequest;

#[test]
fn registration_names_the_dra_service() {
    let n = Node::new();
    let mut c = RegistrationClient::new(n.channel("kubelet/plugins_registry/gpu.cuquota.io-reg.sock"));
    let info = n.rt.block_on(c.get_info(InfoRequest {})).unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.cuquota.io");
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_string()]);
    assert_eq!(
        Path::new(&info.endpoint),
        n.p("kubelet/plugins/gpu.cuquota.io/dra.sock")
    );
    let st = cuquota_dra::proto::registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    n.rt.block_on(c.notify_registration_status(st)).unwrap();
}

#[test]
fn prepare_puts_the_granted_limits_in_place_and_unprepare_removes_them() {
    let n = Node::new();
    let r = n.prepare(&[("notebook-gpu", UID)]);
    let c = &r[UID];
    assert_eq!(c.error, "", "{c:?}");
    assert_eq!(c.devices.len(), 1);
    let d = &c.devices[0];
    assert_eq!(d.cdi_device_ids, vec![format!("cuquota.io/gpu={UID}")]);
    assert_eq!(
        (d.pool_name.as_str(), d.request_names.clone()),
        ("node-1", vec!["gpu".to_string()])
    );
    assert_eq!(d.device_name, GPU.to_lowercase());

    // The limits file: the GPU's entry from consumedCapacity and the claim's configuration; no opt-out; the
    // claim's usage file bound.
    let limits = n.p(&format!("state/claims/{UID}/limits"));
    let snap = *LimitsReader::open(&limits).unwrap().snapshot();
    let e = snap
        .get(DeviceSelector::Uuid(parse_uuid(GPU).unwrap()))
        .expect("the GPU's entry")
        .limits();
    assert_eq!(e.memory, Some(4 << 30));
    assert_eq!(e.sm, Some(30));
    assert_eq!(e.kind, PolicyKind::Hard);
    assert_eq!(e.priority.map(|p| p.as_str()), Some("low"));
    assert_eq!(e.reserved_memory, Some(1 << 30));
    assert_eq!(
        snap.get(DeviceSelector::All).map(|e| e.limits()),
        Some(cuquota_dra::prepare::NOT_GRANTED),
        "any other GPU: nothing"
    );
    assert!(!snap.opt_out_allowed());
    assert_eq!(
        snap.usage_path().unwrap(),
        Some(Path::new("/var/run/cuquota/usage"))
    );
    assert!(snap.usage_id().unwrap().is_some(), "bound by identity");

    // The CDI spec: the library mounted and preloaded, limits and the marker read-only, the usage file.
    let spec = n.cdi_spec();
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["kind"], "cuquota.io/gpu");
    let dev = &spec["devices"][0];
    assert_eq!(dev["name"], UID);
    let env: Vec<&str> = dev["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in [
        "LD_PRELOAD=/usr/lib/cuquota/libcuquota.so",
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
        "CUDA_DEVICE_SM_LIMIT=30",
        &format!("CUDA_VISIBLE_DEVICES={GPU}"),
        "CUQUOTA_USAGE_FILE=/var/run/cuquota/usage",
        "EXTRA=1",
    ] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }
    let mounts = dev["containerEdits"]["mounts"].as_array().unwrap();
    let mount = |c: &str| {
        mounts
            .iter()
            .find(|m| m["containerPath"] == c)
            .unwrap_or_else(|| panic!("no mount at {c}: {mounts:?}"))
    };
    let opts = |c: &str| {
        mount(c)["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    for c in [
        "/usr/lib/cuquota/libcuquota.so",
        "/etc/cuquota/limits",
        "/etc/cuquota/required",
    ] {
        assert!(
            opts(c).contains(&"ro".into()) && opts(c).contains(&"bind".into()),
            "{c}: {:?}",
            opts(c)
        );
    }
    assert!(opts("/var/run/cuquota/usage").contains(&"rw".into()));
    // A priority (low) and a reserve: the claim's own priority file read-write, named `.low` (only `.high`
    // files are trusted by others), and the node's priority directory read-only beside it.
    let own = std::fs::read_link(n.p(&format!("state/claims/{UID}/priority"))).unwrap();
    assert_eq!(own.parent(), Some(n.p("state/priority").as_path()));
    let name = own.file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with(".low") && name.len() == 36, "{name}");
    assert!(opts("/etc/cuquota/priority").contains(&"rw".into()));
    assert_eq!(
        mount("/etc/cuquota/priority")["hostPath"],
        own.display().to_string()
    );
    assert!(own.is_file());
    assert!(opts("/etc/cuquota/priority.d").contains(&"ro".into()));
    assert_eq!(
        mount("/etc/cuquota/priority.d")["hostPath"],
        n.p("state/priority").display().to_string()
    );
    assert_eq!(
        mount("/etc/cuquota/limits")["hostPath"],
        limits.display().to_string()
    );
    assert_eq!(
        mount("/usr/lib/cuquota/libcuquota.so")["hostPath"],
        n.p("lib/libcuquota.so").display().to_string()
    );
    assert!(Path::new(mount("/etc/cuquota/required")["hostPath"].as_str().unwrap()).is_file());
    assert!(Path::new(mount("/var/run/cuquota/usage")["hostPath"].as_str().unwrap()).is_file());

    // The pod's cgroup does not exist yet: no descriptor. Once it does, the plugin writes it.
    let desc = n.p(&format!("agent/dra-{UID}-{POD_UID}.toml"));
    assert!(!desc.exists());
    let cg = n.p(&format!("cgroup/kubepods/burstable/pod{POD_UID}"));
    std::fs::create_dir_all(&cg).unwrap();
    for _ in 0..1000 {
        if desc.exists() {
            break;
        }
        // The plugin runs on this runtime: drive it while waiting.
        n.rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(10)).await });
    }
    let text = std::fs::read_to_string(&desc).expect("the descriptor, once the pod's cgroup exists");
    let t: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(t["members"]["cgroup"].as_str(), Some(cg.to_str().unwrap()));
    assert_eq!(t["limits"].as_str(), Some(limits.to_str().unwrap()));
    assert_eq!(t["pod"].as_str(), Some("notebook-0"));
    assert_eq!(t["namespace"].as_str(), Some("team-a"));
    assert_eq!(t["enforce"]["memory"].as_str(), Some("kill"));

    // Unprepare removes everything; a second unprepare is success.
    assert_eq!(n.unprepare(UID), "");
    assert!(!limits.exists() && !desc.exists());
    assert!(!n.p(&format!("cdi/cuquota.io-gpu-{UID}.json")).exists());
    assert!(!own.exists(), "the claim's priority file goes with it");
    assert_eq!(n.unprepare(UID), "");
}

#[test]
fn prepare_is_idempotent_and_survives_a_restart() {
    let mut n = Node::new();
    let first = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(first[UID].error, "");
    let usage = n.p(&format!("state/claims/{UID}/usage"));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let usage_ino = ino(&usage);
    let again = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(first, again);
    assert_eq!(
        ino(&usage),
        usage_ino,
        "the usage file a running container has open stays"
    );

    // Restart with the API unreachable (no claim source at all): the checkpoint answers prepare, and
    // unprepare works.
    n.stop();
    std::fs::remove_dir_all(n.p("claims")).unwrap();
    n.start();
    let again = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(first, again);
    n.stop();
    n.start();
    assert_eq!(n.unprepare(UID), "");
    assert!(!n.p(&format!("state/claims/{UID}")).exists());
    assert!(!n.p(&format!("cdi/cuquota.io-gpu-{UID}.json")).exists());
}

#[test]
fn a_claim_the_node_cannot_honour_gets_its_error_and_no_files() {
    let n = Node::new();
    type Edit = fn(&mut serde_json::Value);
    let bad: [(&str, &str, Edit); 6] = [
        ("unknown-gpu", "11111111-0000-0000-0000-000000000001", |v| {
            v["status"]["allocation"]["devices"]["results"][0]["device"] =
                "gpu-ffffffff-0000-0000-0000-000000000000".into()
        }),
        ("not-allocated", "11111111-0000-0000-0000-000000000002", |v| {
            v["status"].as_object_mut().unwrap().remove("allocation");
        }),
        ("too-much", "11111111-0000-0000-0000-000000000003", |v| {
            v["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = "81Gi".into()
        }),
        ("bad-policy", "11111111-0000-0000-0000-000000000004", |v| {
            v["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["policy"] =
                "disabled".into()
        }),
        ("typo", "11111111-0000-0000-0000-000000000005", |v| {
            v["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["polcy"] = "hard".into()
        }),
        ("uid-mismatch", "11111111-0000-0000-0000-000000000006", |v| {
            v["metadata"]["uid"] = "22222222-0000-0000-0000-000000000000".into()
        }),
    ];
    let mut ask = vec![("notebook-gpu", UID)];
    for (name, uid, edit) in &bad {
        let mut v = fixture();
        v["metadata"]["uid"] = (*uid).into();
        edit(&mut v);
        n.put_claim(name, &v);
        ask.push((name, uid));
    }
    ask.push(("missing", "11111111-0000-0000-0000-000000000007"));
    let r = n.prepare(&ask);
    assert_eq!(r.len(), ask.len(), "an answer per claim");
    assert_eq!(r[UID].error, "", "a good claim beside bad ones is prepared");
    let want = [
        "is not a GPU of this node",
        "not allocated",
        "not within the device's",
        "policy \"disabled\"",
        "unknown field `polcy`",
        "UID",
        "cannot read the ResourceClaim",
    ];
    for ((name, uid), w) in ask[1..].iter().zip(want) {
        let e = &r[*uid].error;
        assert!(e.contains(w), "{name}: {e:?} should say {w:?}");
        assert!(r[*uid].devices.is_empty());
        assert!(
            !n.p(&format!("state/claims/{uid}")).exists(),
            "{name}: files written"
        );
        assert!(!n.p(&format!("cdi/cuquota.io-gpu-{uid}.json")).exists());
    }

    // Without the library on the node a claim is refused (the container would run without limits).
    std::fs::remove_file(n.p("lib/libcuquota.so")).unwrap();
    let mut v = fixture();
    v["metadata"]["uid"] = "11111111-0000-0000-0000-000000000008".into();
    n.put_claim("no-library", &v);
    let r = n.prepare(&[("no-library", "11111111-0000-0000-0000-000000000008")]);
    assert!(
        r["11111111-0000-0000-0000-000000000008"]
            .error
            .contains("library"),
        "{r:?}"
    );
}

#[test]
fn a_claim_of_two_gpus_gets_one_cdi_device_with_both() {
    let n = Node::new();
    let gpu2 = "GPU-00000000-0000-0000-0000-000000000002";
    let mut v = fixture();
    let uid = "33333333-0000-0000-0000-000000000001";
    v["metadata"]["uid"] = uid.into();
    let results = &mut v["status"]["allocation"]["devices"]["results"];
    let mut second = results[0].clone();
    second["request"] = "second".into();
    second["device"] = gpu2.to_lowercase().into();
    second["consumedCapacity"] = serde_json::json!({"memory": "1536Mi", "sm": "50"});
    let mut other = results[0].clone();
    other["driver"] = "gpu.nvidia.com".into(); // another driver's device: not ours to prepare
    results.as_array_mut().unwrap().extend([second, other]);
    n.put_claim("two", &v);
    let r = n.prepare(&[("two", uid)]);
    let c = &r[uid];
    assert_eq!(c.error, "", "{c:?}");
    assert_eq!(c.devices.len(), 2);
    assert_eq!(
        c.devices[0].request_names,
        vec!["gpu".to_string(), "second".into()]
    );
    assert_eq!(c.devices[0].cdi_device_ids, vec![format!("cuquota.io/gpu={uid}")]);
    assert!(c.devices[1].cdi_device_ids.is_empty());
    assert_eq!(c.devices[1].device_name, gpu2.to_lowercase());

    let snap = *LimitsReader::open(&n.p(&format!("state/claims/{uid}/limits")))
        .unwrap()
        .snapshot();
    let e2 = snap
        .get(DeviceSelector::Uuid(parse_uuid(gpu2).unwrap()))
        .unwrap()
        .limits();
    assert_eq!((e2.memory, e2.sm), (Some(1536 << 20), Some(50)));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n.layout.cdi_spec_path(uid)).unwrap()).unwrap();
    let env: Vec<&str> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in [
        &format!("CUDA_VISIBLE_DEVICES={GPU},{gpu2}") as &str,
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_1=1536m",
        "CUDA_DEVICE_SM_LIMIT_0=30",
        "CUDA_DEVICE_SM_LIMIT_1=50",
    ] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }
    assert!(
        !env.iter().any(|e| e.starts_with("CUDA_DEVICE_SM_LIMIT=")),
        "{env:?}"
    );
}

#[test]
fn the_pod_cgroup_is_found_in_the_kubelets_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let uid = "aaaabbbb-cccc-dddd-eeee-ffff00001111";
    assert_eq!(cuquota_dra::prepare::pod_cgroup(dir.path(), uid), None);
    // systemd driver, v1 memory hierarchy, besteffort pod.
    let p = dir.path().join(
        "memory/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podaaaabbbb_cccc_dddd_eeee_ffff00001111.slice",
    );
    std::fs::create_dir_all(&p).unwrap();
    assert_eq!(cuquota_dra::prepare::pod_cgroup(dir.path(), uid), Some(p));
    // cgroupfs driver, v2 (the root): preferred over v1's hierarchies.
    let v2 = dir.path().join(format!("kubepods/pod{uid}"));
    std::fs::create_dir_all(&v2).unwrap();
    assert_eq!(cuquota_dra::prepare::pod_cgroup(dir.path(), uid), Some(v2));
}

/// The tenant's view of claim `uid`'s priority mounts in its CDI spec, under `view`: `priority` (its own
/// file), `priority.d` (the node directory) and `priority.counters`, linked as the mounts would show them.
fn tenant_view(n: &Node, uid: &str, view: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n.p(&format!("cdi/cuquota.io-gpu-{uid}.json"))).unwrap())
            .unwrap();
    let mounts = spec["devices"][0]["containerEdits"]["mounts"].as_array().unwrap();
    let host = |c: &str| {
        let m = mounts.iter().find(|m| m["containerPath"] == c);
        std::path::PathBuf::from(
            m.unwrap_or_else(|| panic!("no {c}: {mounts:?}"))["hostPath"]
                .as_str()
                .unwrap(),
        )
    };
    std::fs::create_dir_all(view).unwrap();
    let dir = host("/etc/cuquota/priority.d");
    std::fs::hard_link(host("/etc/cuquota/priority"), view.join("priority")).unwrap();
    std::os::unix::fs::symlink(&dir, view.join("priority.d")).unwrap();
    std::fs::hard_link(
        host("/etc/cuquota/priority.counters"),
        view.join("priority.counters"),
    )
    .unwrap();
    (view.join("priority"), dir)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Issue 35 item 5: every container with a priority lists the node's priority directory (read-only, at
/// `/etc/cuquota/priority.d`) and can read every file in it, so what it finds there is all another container
/// shows it: the `.high` file of a high-priority claim (presence) and its activity words. Played as the tenant
/// of a low claim, from the CDI specs' mounts: the names carry neither claim's UID (main named them
/// `<claim uid>.high`), and the high-priority claim's launches leave no count in its file there (main: every
/// launch counted in it); the counts stay in its own counters file. Control: the low claim's shim view still
/// finds its own file (not high) and the present, active high-priority tenant.
#[test]
fn a_tenant_reading_the_node_priority_directory_learns_no_claim_uid_or_counts() {
    use cuquota_core::region::layout::PriorityDevice;
    use cuquota_core::region::PriorityRegion;
    let n = Node::new();
    let high_uid = "44444444-0000-0000-0000-000000000001";
    let mut v = fixture();
    v["metadata"]["uid"] = high_uid.into();
    let cfg = &mut v["status"]["allocation"]["devices"]["config"][0];
    cfg["source"] = "FromClass".into();
    cfg["opaque"]["parameters"]["priority"] = "high".into();
    cfg["opaque"]["parameters"]
        .as_object_mut()
        .unwrap()
        .remove("reservedMemory");
    n.put_claim("inference", &v);
    let r = n.prepare(&[("notebook-gpu", UID), ("inference", high_uid)]);
    assert_eq!(r[UID].error, "", "{:?}", r[UID]);
    assert_eq!(r[high_uid].error, "", "{:?}", r[high_uid]);
    let gpu = parse_uuid(GPU).unwrap();

    // The high-priority claim's processes launch (through its own mounts).
    let (high_own, _) = tenant_view(&n, high_uid, &n.p("view-high"));
    let high = PriorityRegion::open(&high_own).unwrap();
    let he = high.entry(high.device(&gpu).unwrap());
    let t = monotonic_ns();
    he.note_hp_launch(t, t);
    he.note_hp_launch(t, t);
    assert_eq!(high.devices(t)[0].hp_launches, 2, "its own counts, kept");

    // The low claim's tenant: names, then the high file's words.
    let (own, dir) = tenant_view(&n, UID, &n.p("view-low"));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for uid in [UID, high_uid] {
        assert!(
            !names.iter().any(|f| f.contains(&uid[..8])),
            "the node directory names claim {uid}: {names:?}"
        );
    }
    let highs: Vec<&String> = names.iter().filter(|f| f.ends_with(".high")).collect();
    assert_eq!(highs.len(), 1, "the high-priority claim's presence: {names:?}");
    let bytes = std::fs::read(dir.join(highs[0])).unwrap();
    let word = |f: usize| {
        let at = std::mem::offset_of!(cuquota_core::region::layout::PriorityFile, devices) + f;
        u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
    };
    assert_eq!(
        word(std::mem::offset_of!(PriorityDevice, hp_launches)),
        0,
        "another claim's launch count is readable in the node directory"
    );
    assert_eq!(
        word(std::mem::offset_of!(PriorityDevice, hp_last_launch)),
        t,
        "its activity"
    );

    // Control: the shim of the low claim finds its own file by inode (not high) and the high-priority
    // tenant, which launched just now.
    let region = PriorityRegion::open(&own).unwrap();
    let e = region.entry(region.device(&gpu).unwrap());
    let now = monotonic_ns();
    assert!(!e.granted_high(now), "the low claim is not high priority");
    assert_eq!(e.hp(now).last_launch, t, "the high-priority tenant's activity");
}

/// A claim whose allocation carries `class` as the DeviceClass's opaque configuration and `claim` as the
/// claim's own (`None`: no entry from that source).
fn claim_with(
    uid: &str,
    class: Option<serde_json::Value>,
    claim: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut v = fixture();
    v["metadata"]["uid"] = uid.into();
    let entry = |source: &str, params: serde_json::Value| {
        let mut p = serde_json::json!({"apiVersion": "gpu.cuquota.io/v1alpha1", "kind": "GpuConfig"});
        p.as_object_mut()
            .unwrap()
            .extend(params.as_object().unwrap().clone());
        serde_json::json!({"source": source, "requests": ["gpu"], "opaque": {"driver": "gpu.cuquota.io", "parameters": p}})
    };
    let mut config = Vec::new();
    config.extend(class.map(|c| entry("FromClass", c)));
    config.extend(claim.map(|c| entry("FromClaim", c)));
    v["status"]["allocation"]["devices"]["config"] = config.into();
    v
}

/// What the plugin wrote into a prepared claim's limits file for the GPU, and its priority file's name.
fn granted(n: &Node, uid: &str) -> Option<(cuquota_core::Policy, String)> {
    let snap = *LimitsReader::open(&n.p(&format!("state/claims/{uid}/limits")))
        .ok()?
        .snapshot();
    let e = snap.get(DeviceSelector::Uuid(parse_uuid(GPU).unwrap()))?.limits();
    // The claim's file in the node directory, by the link the plugin keeps (its name carries no UID).
    let prio = std::fs::read_link(n.p(&format!("state/claims/{uid}/priority")))
        .ok()
        .filter(|f| f.exists())
        .and_then(|f| Some(f.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "no priority file".into());
    Some((e, prio))
}

#[test]
fn a_claim_cannot_raise_what_its_device_class_sets() {
    use serde_json::json;
    let n = Node::new();
    let class = json!({"policy": "hard", "priority": "low", "weight": 10, "reservedMemory": "2Gi"});
    // Each: (what, the class, the claim's attempt, the parameter the error must name).
    let attacks = [
        (
            "priority high over low",
            class.clone(),
            json!({"priority": "high"}),
            "priority",
        ),
        (
            "priority 0 (HAMi's high)",
            class.clone(),
            json!({"priority": "0"}),
            "priority",
        ),
        (
            "burst over hard",
            class.clone(),
            json!({"policy": "burst"}),
            "policy",
        ),
        (
            "default over hard",
            class.clone(),
            json!({"policy": "default"}),
            "policy",
        ),
        (
            "weight 1000 over 10",
            class.clone(),
            json!({"weight": 1000}),
            "weight",
        ),
        (
            "reservedMemory 0 over 2Gi",
            class.clone(),
            json!({"reservedMemory": "0"}),
            "reservedMemory",
        ),
        (
            "reservedMemory 1Gi over 2Gi",
            class.clone(),
            json!({"reservedMemory": "1Gi"}),
            "reservedMemory",
        ),
        // The class grants no priority at all: a pod author must not make itself high priority.
        (
            "high priority from a class without one",
            json!({"policy": "burst"}),
            json!({"priority": "high"}),
            "priority",
        ),
        // The class sets no weight: the default (100) is the operator's.
        (
            "weight 1000 over the default",
            json!({}),
            json!({"weight": 1000}),
            "weight",
        ),
        // Memory and SM share are what the scheduler granted (consumedCapacity): no configuration names them.
        (
            "memory in the claim's configuration",
            class.clone(),
            json!({"memory": "80Gi"}),
            "unknown field `memory`",
        ),
        (
            "sm in the claim's configuration",
            class.clone(),
            json!({"sm": 100}),
            "unknown field `sm`",
        ),
    ];
    let mut ask = Vec::new();
    for (i, (what, class, claim, _)) in attacks.iter().enumerate() {
        let uid = format!("44444444-0000-0000-0000-{i:012}");
        n.put_claim(
            &format!("attack-{i}"),
            &claim_with(&uid, Some(class.clone()), Some(claim.clone())),
        );
        ask.push((format!("attack-{i}"), uid, *what));
    }
    let names: Vec<(&str, &str)> = ask.iter().map(|(n, u, _)| (n.as_str(), u.as_str())).collect();
    let r = n.prepare(&names);
    // Every escalation is judged (and every one that got through is listed) before failing.
    let mut through = Vec::new();
    for ((_, uid, what), (.., param)) in ask.iter().zip(&attacks) {
        let e = &r[uid].error;
        let g = granted(&n, uid);
        let high = n.p(&format!("state/priority/{uid}.high")).exists();
        if !e.contains(param) || !r[uid].devices.is_empty() || g.is_some() || high {
            through.push(format!("{what}: error {e:?}, granted {g:?}"));
        }
    }
    assert!(
        through.is_empty(),
        "escalations prepared:\n{}",
        through.join("\n")
    );

    // Controls: a claim that asks for less gets exactly what it asked; one that asks nothing gets the class's;
    // a claim may repeat its class's values, and make `burst` `hard`.
    let high = json!({"policy": "burst", "priority": "high", "weight": 10, "reservedMemory": "2Gi"});
    let controls = [
        (
            class.clone(),
            Some(json!({"priority": "low", "policy": "hard", "weight": 5, "reservedMemory": "3Gi"})),
        ),
        (class.clone(), None),
        (
            high.clone(),
            Some(json!({"priority": "low", "weight": 1, "reservedMemory": "4Gi", "policy": "hard"})),
        ),
        (high.clone(), Some(json!({"priority": "high", "weight": 10}))),
    ];
    let want = [
        (PolicyKind::Hard, Some("low"), Some(5), Some(3u64 << 30), ".low"),
        (PolicyKind::Hard, Some("low"), Some(10), Some(2 << 30), ".low"),
        (PolicyKind::Hard, Some("low"), Some(1), Some(4 << 30), ".low"),
        (PolicyKind::Burst, Some("high"), Some(10), Some(2 << 30), ".high"),
    ];
    for (i, ((class, claim), want)) in controls.into_iter().zip(want).enumerate() {
        let uid = format!("55555555-0000-0000-0000-{i:012}");
        n.put_claim(&format!("control-{i}"), &claim_with(&uid, Some(class), claim));
        let r = n.prepare(&[(&format!("control-{i}"), &uid)]);
        assert_eq!(r[&uid].error, "", "control {i}");
        let (p, file) = granted(&n, &uid).expect("the limits file");
        assert_eq!(
            (
                p.kind,
                p.priority.map(|p| p.as_str()),
                p.weight,
                p.reserved_memory
            ),
            (want.0, want.1, want.2, want.3),
            "control {i}"
        );
        assert!(file.ends_with(want.4), "control {i}: {file}");
    }
}

#[test]
fn a_memory_limit_above_the_grant_makes_the_claim_elastic_within_its_class() {
    use serde_json::json;
    const G: u64 = 1 << 30;
    let n = Node::new();
    // The fixture's grant (consumedCapacity, the request) is 4Gi of an 80Gi GPU. Each attack: the class, the
    // claim's configuration; every one is refused naming memoryLimit, and nothing is written.
    let attacks = [
        (
            "a limit from a class without one",
            json!({}),
            json!({"memoryLimit": "16Gi"}),
        ),
        (
            "above the class's",
            json!({"memoryLimit": "8Gi"}),
            json!({"memoryLimit": "16Gi"}),
        ),
        (
            "below the grant",
            json!({"memoryLimit": "16Gi"}),
            json!({"memoryLimit": "2Gi"}),
        ),
        (
            "above the device",
            json!({"memoryLimit": "100Gi"}),
            json!({"memoryLimit": "90Gi"}),
        ),
        (
            "not a quantity",
            json!({"memoryLimit": "16Gi"}),
            json!({"memoryLimit": "lots"}),
        ),
    ];
    for (i, (what, class, claim)) in attacks.into_iter().enumerate() {
        let uid = format!("66666666-0000-0000-0000-{i:012}");
        n.put_claim(
            &format!("elastic-attack-{i}"),
            &claim_with(&uid, Some(class), Some(claim)),
        );
        let r = n.prepare(&[(&format!("elastic-attack-{i}"), &uid)]);
        let e = &r[&uid].error;
        assert!(e.contains("memoryLimit"), "{what}: error {e:?}");
        assert!(granted(&n, &uid).is_none(), "{what}: prepared");
    }
    // Controls: (class, claim) → (limit shown, request stored).
    let controls = [
        (json!({}), None, (4 * G, None)),
        (json!({"memoryLimit": "16Gi"}), None, (16 * G, Some(4 * G))),
        (
            json!({"memoryLimit": "16Gi"}),
            Some(json!({"memoryLimit": "8Gi"})),
            (8 * G, Some(4 * G)),
        ),
        (json!({"memoryLimit": "200Gi"}), None, (80 * G, Some(4 * G))),
        (json!({"memoryLimit": "2Gi"}), None, (4 * G, None)),
    ];
    for (i, (class, claim, want)) in controls.into_iter().enumerate() {
        let uid = format!("77777777-0000-0000-0000-{i:012}");
        n.put_claim(&format!("elastic-{i}"), &claim_with(&uid, Some(class), claim));
        let r = n.prepare(&[(&format!("elastic-{i}"), &uid)]);
        assert_eq!(r[&uid].error, "", "control {i}");
        let (p, _) = granted(&n, &uid).expect("the limits file");
        assert_eq!(
            (p.memory, p.memory_request),
            (Some(want.0), want.1),
            "control {i}"
        );
        // HAMi-compatible programs are shown the limit.
        let cdi = std::fs::read_to_string(n.p(&format!("cdi/cuquota.io-gpu-{uid}.json"))).unwrap();
        let env = format!("CUDA_DEVICE_MEMORY_LIMIT_0={}m", want.0 >> 20);
        assert!(cdi.contains(&env), "control {i}: {env} missing in {cdi}");
    }
}

#[test]
fn a_gpu_the_claim_was_not_granted_is_not_unlimited() {
    // The plugin's CUDA_VISIBLE_DEVICES names the granted GPU, but a program may name another one the container
    // can reach (a node whose device nodes every claim gets) in its own environment, or setenv it before cuInit.
    // The plugin's limits file, not the variable, must decide what it may use there: nothing.
    use shim_tests::{Prog, Sim, GIB};
    let n = Node::new();
    let uid = "66666666-0000-0000-0000-000000000001";
    n.put_claim("plain", &claim_with(uid, None, Some(serde_json::json!({}))));
    assert_eq!(n.prepare(&[("plain", uid)])[uid].error, "");
    let other = "GPU-00000000-0000-0000-0000-000000000002";
    let sim = Sim::new()
        .devices(2)
        .memory("80g")
        .uuids(&format!("{GPU},{other}"))
        .build();
    // The plugin's file as written, but for the usage binding (the container's path: no container here).
    std::fs::copy(n.p(&format!("state/claims/{uid}/limits")), sim.limits_file()).unwrap();
    cuquota_core::region::LimitsWriter::open(&sim.limits_file())
        .unwrap()
        .update(|t| t.set_usage(None, None))
        .unwrap()
        .unwrap();
    let run = |visible: &str| {
        sim.cmd(Prog::Probe)
            .env("CUDA_VISIBLE_DEVICES", visible)
            .args("init totalmem alloc:mem:6g")
            .run()
    };
    // Control: the granted GPU has its 4 GiB.
    let out = run(GPU);
    assert_eq!(out.num("totalmem"), 4 * GIB, "{out:?}");
    assert_eq!(out.val("alloc.0"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    // Attack: the other GPU.
    let out = run(other);
    assert_eq!(
        (out.val("ctx"), out.num("totalmem"), out.val("alloc.0")),
        ("CUDA_ERROR_OUT_OF_MEMORY", 1, "CUDA_ERROR_OUT_OF_MEMORY"),
        "a GPU the claim was not granted: {out:?}"
    );
}

#[test]
fn a_node_without_the_gpus_driver_files_refuses_the_claim_and_writes_nothing() {
    // The plugin looks for the driver on a node that has none (no NVIDIA spec, no /dev/nvidiactl, no
    // libcuda.so.1): the pod must not start without a usable GPU.
    let n = Node::with(|l| {
        let root = l.state_dir.parent().unwrap().join("node");
        l.driver = Some(cuquota_dra::gpu_access::DriverFiles {
            host_root: root.clone(),
            driver_root: "/".into(),
            dev_root: "/".into(),
            cdi_dirs: vec!["/etc/cdi".into()],
        });
    });
    let r = n.prepare(&[("notebook-gpu", UID)]);
    assert!(r[UID].error.contains("nvidiactl"), "{r:?}");
    assert!(!n.p("state/claims").join(UID).exists());
    assert!(!n.layout.cdi_spec_path(UID).exists());

    // The control: the driver's files appear on the node, and the same claim is prepared with them.
    let root = n.p("node");
    for d in ["dev/nvidiactl", "dev/nvidia0", "usr/lib64/libcuda.so.1"] {
        let p = root.join(d);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
    }
    let r = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    let edits = &n.cdi_spec()["devices"][0]["containerEdits"];
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/nvidiactl", "{edits}");
    assert!(
        edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["containerPath"] == "/usr/lib64/libcuda.so.1"
                && m["hostPath"] == "/usr/lib64/libcuda.so.1"),
        "{edits}"
    );
}
