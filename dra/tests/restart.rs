//! Restarts and reboots, played as the kubelet and the node do them: the kubelet deletes every ResourceSlice of
//! its node when it starts (the plugin binary, against an in-test API server that keeps objects, publishes it
//! again), a reboot empties `/var/run/cdi` (a tmpfs: the plugin writes its CDI specs again from its
//! checkpoints), and preparations nothing holds any more are removed.

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fixture, Node, GPU, POD_UID, UID};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

const SLICE: &str = "node-1-gpu.cuquota.io";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices/";
const NODE_UID: &str = "9d2b8c1e-0000-4000-8000-00000000a0de";

/// What the API server holds: ResourceSlices by name, and every request (method, path).
#[derive(Default)]
struct Api {
    slices: BTreeMap<String, Value>,
    /// Play a cluster with DRAConsumableCapacity off: the fields it adds are dropped on write.
    drop_consumable_capacity: bool,
    /// Play a cluster with DRADeviceTaints off: devices' taints are dropped on write.
    drop_taints: bool,
    calls: Vec<(String, String)>,
    version: u64,
}

type Shared = Arc<Mutex<Api>>;

async fn serve(
    req: Request<hyper::body::Incoming>,
    api: Shared,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut a = api.lock().unwrap();
    a.calls.push((method.clone(), path.clone()));
    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
    let (status, out) = match (method.as_str(), path.strip_prefix(SLICES)) {
        ("GET", None) if path == "/api/v1/nodes/node-1" => (
            200,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "uid": NODE_UID}}),
        ),
        ("GET", Some(name)) => match a.slices.get(name) {
            Some(s) => (200, s.clone()),
            None => (404, not_found),
        },
        // Server-side apply by the only manager: the stored object is what was applied (less dropped fields).
        ("PATCH", Some(name)) => {
            let mut s: Value = serde_json::from_slice(&body).unwrap();
            if a.drop_consumable_capacity {
                for d in s["spec"]["devices"].as_array_mut().unwrap() {
                    d.as_object_mut().unwrap().remove("allowMultipleAllocations");
                    for c in d["capacity"].as_object_mut().unwrap().values_mut() {
                        c.as_object_mut().unwrap().remove("requestPolicy");
                    }
                }
            }
            if a.drop_taints {
                for d in s["spec"]["devices"].as_array_mut().unwrap() {
                    d.as_object_mut().unwrap().remove("taints");
                }
            }
            a.version += 1;
            let uid = a.slices.get(name).map_or_else(
                || format!("00000000-0000-4000-8000-{:012}", a.version),
                |old| old["metadata"]["uid"].as_str().unwrap().to_string(),
            );
            s["metadata"]["uid"] = uid.into();
            s["metadata"]["resourceVersion"] = a.version.to_string().into();
            a.slices.insert(name.to_string(), s.clone());
            (200, s)
        }
        ("DELETE", Some(name)) => match a.slices.remove(name) {
            Some(s) => (200, s),
            None => (404, not_found),
        },
        _ => (404, not_found),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(out.to_string())))
        .unwrap())
}

/// The plugin binary against the API server, resyncing every second; stderr to a file.
struct Plugin {
    child: Child,
    stderr: std::path::PathBuf,
}

impl Plugin {
    fn start(dir: &Path, server: &str) -> Plugin {
        Plugin::start_with(dir, server, &[])
    }

    /// On the simulator's NVML with two GPUs and `env` (its knobs), probing health every second.
    fn start_sim(dir: &Path, server: &str, env: &[(&str, &str)]) -> Plugin {
        let lib = shim_tests::sim_lib();
        let state = dir.join("sim.state");
        let mut all: Vec<(&str, &str)> = vec![
            ("CUQUOTA_LIBNVML", lib.to_str().unwrap()),
            ("CUDASIM_STATE", state.to_str().unwrap()),
            ("CUDASIM_DEVICES", "2"),
            ("CUDASIM_MEMORY", "80g,16g"),
        ];
        all.extend_from_slice(env);
        Plugin::start_with(dir, server, &all)
    }

    /// `--gpu` unless `env` names the simulator (which then lists the GPUs).
    fn start_with(dir: &Path, server: &str, env: &[(&str, &str)]) -> Plugin {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: stub, cluster: {{server: \"{server}\"}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: stub, user: u}}}}]\n\
                 current-context: c\n"
            ),
        )
        .unwrap();
        let stderr = dir.join("plugin.err");
        let mut c = Command::new(env!("CARGO_BIN_EXE_cuquota-dra-plugin"));
        c.args(["--node", "node-1"]);
        if env.is_empty() {
            c.args(["--gpu", &format!("{GPU}=80Gi")]);
        } else {
            c.args(["--health-seconds", "1"]);
        }
        c.arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--cdi-dir")
            .arg(dir.join("cdi"))
            .arg("--plugin-dir")
            .arg(dir.join("plugins"))
            .arg("--registrar-dir")
            .arg(dir.join("registry"))
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            // The old binary has no flag for it: the environment keeps the test runnable against it.
            .env("CUQUOTA_DRA_RESYNC_SECONDS", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let child = c.envs(env.iter().copied()).spawn().unwrap();
        Plugin { child, stderr }
    }

    fn log(&self) -> String {
        let mut s = String::new();
        std::fs::File::open(&self.stderr)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A runtime serving the API; its address.
fn api_server(api: Shared) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let api = api.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |r| serve(r, api.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        addr
    });
    (rt, format!("http://{addr}"))
}

/// Serves the API until `done` holds (checked every 50 ms) or `secs` pass; whether it held.
fn wait(rt: &tokio::runtime::Runtime, api: &Shared, secs: u64, done: impl Fn(&Api) -> bool) -> bool {
    rt.block_on(async {
        for _ in 0..secs * 20 {
            if done(&api.lock().unwrap()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    })
}

fn patches(a: &Api) -> usize {
    a.calls.iter().filter(|(m, _)| m == "PATCH").count()
}

#[test]
fn a_slice_the_kubelet_deletes_or_someone_changes_is_published_again() {
    let dir = tempfile::tempdir().unwrap();
    let api: Shared = Arc::default();
    let (rt, server) = api_server(api.clone());
    let plugin = Plugin::start(dir.path(), &server);
    assert!(
        wait(&rt, &api, 60, |a| a.slices.contains_key(SLICE)),
        "never published: {}",
        plugin.log()
    );
    let first = api.lock().unwrap().slices[SLICE].clone();
    assert_eq!(
        first["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": NODE_UID, "controller": true}])
    );
    assert_eq!(first["spec"]["pool"]["generation"], 1);

    // The kubelet starts: it deletes every slice of its node.
    api.lock().unwrap().slices.clear();
    assert!(
        wait(&rt, &api, 60, |a| a.slices.contains_key(SLICE)),
        "not published again after the kubelet deleted it: {}",
        plugin.log()
    );
    assert_eq!(
        api.lock().unwrap().slices[SLICE]["spec"]["devices"],
        first["spec"]["devices"]
    );

    // Someone edits it: applied again, at the same generation (one update; upstream's rule).
    {
        let mut a = api.lock().unwrap();
        let s = a.slices.get_mut(SLICE).unwrap();
        s["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Ti".into();
        s["metadata"]["resourceVersion"] = "999".into();
    }
    assert!(
        wait(&rt, &api, 60, |a| a.slices[SLICE]["spec"]["devices"][0]
            ["capacity"]["memory"]["value"]
            == "80Gi"),
        "an edited slice was not restored: {}",
        plugin.log()
    );
    assert_eq!(api.lock().unwrap().slices[SLICE]["spec"]["pool"]["generation"], 1);

    // Control: a slice that is what the plugin stored is not written again (reads only).
    let before = patches(&api.lock().unwrap());
    let reads = |a: &Api| {
        a.calls
            .iter()
            .filter(|(m, p)| m == "GET" && p.starts_with(SLICES))
            .count()
    };
    let r0 = reads(&api.lock().unwrap());
    assert!(
        wait(&rt, &api, 60, |a| reads(a) >= r0 + 3),
        "no resync: {}",
        plugin.log()
    );
    assert_eq!(patches(&api.lock().unwrap()), before, "{}", plugin.log());
}

#[test]
fn a_cluster_that_drops_consumable_capacity_gets_no_exclusive_gpus_and_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let api: Shared = Arc::new(Mutex::new(Api {
        drop_consumable_capacity: true,
        ..Api::default()
    }));
    let (rt, server) = api_server(api.clone());
    let plugin = Plugin::start(dir.path(), &server);
    assert!(
        wait(&rt, &api, 60, |a| patches(a) >= 2),
        "the plugin did not try to publish: {}",
        plugin.log()
    );
    let log = plugin.log();
    assert!(
        log.contains("allowMultipleAllocations") && log.contains("DRAConsumableCapacity=true"),
        "{log}"
    );
    // Each attempt's slice was deleted again: no GPU is offered whole.
    assert!(
        wait(&rt, &api, 10, |a| a.slices.is_empty()),
        "{:?}",
        api.lock().unwrap().slices
    );
}

#[test]
fn a_reboot_empties_the_cdi_directory_and_the_plugin_writes_it_again() {
    let mut n = Node::new();
    let first = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(first[UID].error, "");
    let spec = n.layout.cdi_spec_path(UID);
    let before = std::fs::read_to_string(&spec).unwrap();

    // Reboot: /var/run/cdi is a tmpfs; the state directory is on disk (the priority directory here on a tmpfs
    // too: --priority-dir may put it there).
    n.stop();
    std::fs::remove_dir_all(&n.layout.cdi_dir).unwrap();
    let own = std::fs::read_link(n.p(&format!("state/claims/{UID}/priority"))).unwrap();
    std::fs::remove_dir_all(n.p("state/priority")).unwrap();
    n.start();
    // The kubelet may start the pod's containers again before it asks to prepare: the spec is there at start.
    let _ = n.dra(); // the plugin is serving
    assert_eq!(
        std::fs::read_to_string(&spec).ok(),
        Some(before.clone()),
        "the CDI spec after the restart"
    );
    assert!(
        own.is_file(),
        "the claim's priority file, made again where its link says"
    );

    // Reboot with the API server unreachable: the re-prepare is answered from the checkpoint, spec written.
    n.stop();
    std::fs::rename(n.p("claims"), n.p("claims.away")).unwrap();
    n.start();
    let _ = n.dra();
    std::fs::remove_dir_all(&n.layout.cdi_dir).unwrap();
    let again = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(again, first);
    assert_eq!(
        std::fs::read_to_string(&spec).ok(),
        Some(before),
        "the CDI spec after the re-prepare"
    );
}

#[test]
fn preparations_nothing_holds_are_removed_at_start() {
    let mut n = Node::new();
    let agent = n.p("agent");
    let desc = |uid: &str| agent.join(format!("dra-{uid}-{POD_UID}.toml"));
    std::fs::create_dir_all(n.p(&format!("cgroup/kubepods/pod{POD_UID}"))).unwrap();
    // Kept: a claim that still exists. Gone: a claim deleted while the plugin was down. Broken: a prepare that
    // never wrote its checkpoint.
    let (kept, gone, broken) = (
        UID,
        "66666666-0000-0000-0000-000000000001",
        "66666666-0000-0000-0000-000000000002",
    );
    for (name, uid) in [("gone", gone), ("broken", broken)] {
        let mut v = fixture();
        v["metadata"]["uid"] = uid.into();
        n.put_claim(name, &v);
    }
    let r = n.prepare(&[("notebook-gpu", kept), ("gone", gone), ("broken", broken)]);
    assert!(r.values().all(|c| c.error.is_empty()), "{r:?}");
    for uid in [kept, gone, broken] {
        assert!(desc(uid).is_file() && n.layout.cdi_spec_path(uid).is_file());
    }
    n.stop();
    std::fs::remove_file(n.p("claims/team-a/gone.json")).unwrap();
    std::fs::remove_file(n.p(&format!("state/claims/{broken}/prepared.json"))).unwrap();
    // Files of a claim no checkpoint holds, and another driver's spec (not ours: kept).
    let orphan = "66666666-0000-0000-0000-000000000003";
    std::fs::write(n.layout.cdi_spec_path(orphan), b"{}").unwrap();
    std::fs::write(desc(orphan), b"").unwrap();
    let nvidia = n.p("cdi/nvidia.com-gpu.json");
    std::fs::write(&nvidia, b"{}").unwrap();
    n.start();
    let _ = n.dra();
    let left = |uid: &str| {
        [
            n.p(&format!("state/claims/{uid}")),
            n.layout.cdi_spec_path(uid),
            desc(uid),
        ]
        .into_iter()
        .filter(|p| p.exists())
        .collect::<Vec<_>>()
    };
    assert!(left(broken).is_empty(), "{:?}", left(broken));
    assert!(left(orphan).is_empty(), "{:?}", left(orphan));
    // The API is asked after serving starts: wait for it.
    n.rt.block_on(async {
        for _ in 0..200 {
            if left(gone).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(left(gone).is_empty(), "{:?}", left(gone));
    assert_eq!(left(kept).len(), 3, "control: the live claim keeps its files");
    assert!(nvidia.is_file(), "another driver's CDI spec is not ours");
}

#[test]
fn after_a_reboot_nvidias_device_is_answered_beside_the_claims_own_again() {
    let mut n = Node::with(|l| {
        let root = l.state_dir.parent().unwrap().join("node");
        l.driver = Some(cuquota_dra::gpu_access::DriverFiles {
            host_root: root,
            driver_root: "/".into(),
            dev_root: "/".into(),
            cdi_dirs: vec!["/etc/cdi".into()],
        });
    });
    let spec = n.p("node/etc/cdi/nvidia.json");
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    std::fs::write(
        &spec,
        json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": GPU, "containerEdits": {}}]})
            .to_string(),
    )
    .unwrap();
    let first = n.prepare(&[("notebook-gpu", UID)]);
    let want = [format!("cuquota.io/gpu={UID}"), format!("nvidia.com/gpu={GPU}")];
    assert_eq!(first[UID].devices[0].cdi_device_ids, want, "{first:?}");
    n.stop();
    std::fs::remove_dir_all(&n.layout.cdi_dir).unwrap();
    std::fs::rename(n.p("claims"), n.p("claims.away")).unwrap();
    n.start();
    let again = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(again, first);
    assert!(n.layout.cdi_spec_path(UID).is_file());
}

/// The taints of the published slice's devices, by device name (none: empty).
fn taints(a: &Api) -> Vec<(String, Vec<Value>)> {
    a.slices.get(SLICE).map_or_else(Vec::new, |s| {
        s["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let t = d["taints"].as_array().cloned().unwrap_or_default();
                (d["name"].as_str().unwrap().to_string(), t)
            })
            .collect()
    })
}

fn slice_gets(a: &Api) -> usize {
    a.calls
        .iter()
        .filter(|(m, p)| m == "GET" && p.ends_with(SLICE))
        .count()
}

/// A GPU that falls off the bus (the simulator's NVML answers `NVML_ERROR_GPU_IS_LOST` from the plugin's 9th
/// `nvmlDeviceGetMemoryInfo` on) is tainted in the published slice (NoSchedule, value why), at the next resync
/// (1 s) and at the slice's generation (an update keeps it); both GPUs are lost, both tainted.
#[test]
fn a_gpu_that_falls_off_the_bus_is_tainted_in_the_slice() {
    let dir = tempfile::tempdir().unwrap();
    let api: Shared = Arc::default();
    let (rt, server) = api_server(api.clone());
    let plugin = Plugin::start_sim(
        dir.path(),
        &server,
        &[("CUDASIM_FAULT", "nvmlDeviceGetMemoryInfo:9+:GPU_IS_LOST")],
    );
    let tainted = |a: &Api| {
        let t = taints(a);
        t.len() == 2 && t.iter().all(|(_, t)| t.len() == 1)
    };
    assert!(
        wait(&rt, &api, 60, tainted),
        "no taint: {:?}\n{}",
        taints(&api.lock().unwrap()),
        plugin.log()
    );
    let a = api.lock().unwrap();
    for (_, t) in taints(&a) {
        assert_eq!(t[0]["key"], "gpu.cuquota.io/unhealthy", "{t:?}");
        assert_eq!(t[0]["value"], "gpu-lost", "{t:?}");
        assert_eq!(t[0]["effect"], "NoSchedule", "{t:?}");
        assert!(t[0]["timeAdded"].is_string(), "{t:?}");
    }
    assert_eq!(a.slices[SLICE]["spec"]["pool"]["generation"], 1);
}

/// A critical XID (79) on the second GPU taints that GPU alone (value `xid-79`); control: the first GPU,
/// healthy, carries no taint, three resyncs after the taint appeared.
#[test]
fn a_critical_xid_taints_its_gpu_and_a_healthy_gpu_has_no_taint() {
    let dir = tempfile::tempdir().unwrap();
    let api: Shared = Arc::default();
    let (rt, server) = api_server(api.clone());
    let plugin = Plugin::start_sim(dir.path(), &server, &[("CUDASIM_XID", "1:79@2")]);
    let second = |a: &Api| taints(a).get(1).is_some_and(|(_, t)| !t.is_empty());
    assert!(
        wait(&rt, &api, 60, second),
        "no taint: {:?}\n{}",
        taints(&api.lock().unwrap()),
        plugin.log()
    );
    let gets = slice_gets(&api.lock().unwrap());
    assert!(wait(&rt, &api, 60, |a| slice_gets(a) >= gets + 3));
    let t = taints(&api.lock().unwrap());
    assert!(t[0].1.is_empty(), "the healthy GPU is tainted: {t:?}");
    assert_eq!(t[1].1.len(), 1, "{t:?}");
    assert_eq!(t[1].1[0]["value"], "xid-79", "{t:?}");
}

/// A cluster that drops the taints (DRADeviceTaints off): the plugin says so and goes on serving the slice
/// (not deleted, unlike without consumable capacity), and does not apply again at every resync.
#[test]
fn a_cluster_that_drops_taints_keeps_the_slice_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let api: Shared = Arc::new(Mutex::new(Api {
        drop_taints: true,
        ..Api::default()
    }));
    let (rt, server) = api_server(api.clone());
    let mut plugin = Plugin::start_sim(
        dir.path(),
        &server,
        &[("CUDASIM_FAULT", "nvmlDeviceGetMemoryInfo:9+:GPU_IS_LOST")],
    );
    let said = |p: &Plugin| p.log().contains("DRADeviceTaints=true");
    assert!(wait(&rt, &api, 60, |_| said(&plugin)), "{}", plugin.log());
    let (patches_then, gets) = {
        let a = api.lock().unwrap();
        (patches(&a), slice_gets(&a))
    };
    assert!(wait(&rt, &api, 60, |a| slice_gets(a) >= gets + 3));
    let a = api.lock().unwrap();
    assert!(a.slices.contains_key(SLICE), "the slice was deleted");
    assert_eq!(patches(&a), patches_then, "applied again at each resync");
    assert!(plugin.child.try_wait().unwrap().is_none(), "{}", plugin.log());
    let log = plugin.log();
    assert!(log.contains("gpu-"), "{log}");
}
