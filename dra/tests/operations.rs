//! Operations, as the kubelet and Prometheus see the plugin binary: its probes (`/healthz`, `/readyz`: ready
//! once the kubelet's registration succeeded) and its metrics (prepares, failures, latencies), scraped over
//! HTTP from `--health-listen`.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{fixture, GPU, UID};
use cuquota_dra::proto::dra::dra_plugin_client::DraPluginClient;
use cuquota_dra::proto::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use cuquota_dra::proto::registration::registration_client::RegistrationClient;
use cuquota_dra::proto::registration::{InfoRequest, RegistrationStatus};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on `port`: (status code, body); None while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    Some((code, body))
}

fn channel(rt: &tokio::runtime::Runtime, path: &Path) -> Channel {
    let path = path.to_path_buf();
    rt.block_on(async {
        for _ in 0..1000 {
            if path.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Endpoint::try_from("http://[::1]:1")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
            }))
            .await
            .unwrap()
    })
}

/// The value of the series `name` (labels included) in an OpenMetrics text.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The node's directories and the claim `team-a/notebook-gpu`.
fn node(d: &Path) {
    for sub in ["claims/team-a", "cgroup", "lib"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("lib/libcuquota.so"), b"not really").unwrap();
    std::fs::write(
        d.join("claims/team-a/notebook-gpu.json"),
        serde_json::to_vec(&fixture()).unwrap(),
    )
    .unwrap();
}

/// The plugin binary on the node `d`; `POD_UID` set to `pod_uid` when given (the environment, as the
/// DaemonSet gives it: a binary without the option ignores it).
fn spawn(d: &Path, health_port: Option<u16>, pod_uid: Option<&str>) -> Killed {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuquota-dra-plugin"));
    c.args([
        "--node",
        "node-1",
        "--gpu",
        &format!("{GPU}=80Gi"),
        "--no-driver-files",
    ])
    .arg("--claims-dir")
    .arg(d.join("claims"))
    .arg("--state-dir")
    .arg(d.join("state"))
    .arg("--cdi-dir")
    .arg(d.join("cdi"))
    .arg("--library")
    .arg(d.join("lib/libcuquota.so"))
    .arg("--cgroup-root")
    .arg(d.join("cgroup"))
    .arg("--plugin-dir")
    .arg(d.join("plugins"))
    .arg("--registrar-dir")
    .arg(d.join("registry"))
    .env_remove("POD_UID")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(p) = health_port {
        c.args(["--health-listen", &format!("127.0.0.1:{p}")]);
    }
    if let Some(u) = pod_uid {
        c.env("POD_UID", u);
    }
    Killed(c.spawn().unwrap())
}

#[test]
fn probes_follow_the_registration_and_metrics_count_prepares_failures_and_latency() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    node(d);
    // A free port (released before the plugin binds it).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _plugin = spawn(d, Some(port), None);
    let mut health = None;
    for _ in 0..1000 {
        health = get(port, "/healthz");
        if health.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(health.map(|h| h.0), Some(200), "liveness");
    // Control: not ready before the kubelet has registered the plugin.
    let (code, body) = get(port, "/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut reg = RegistrationClient::new(channel(&rt, &d.join("registry/gpu.cuquota.io-reg.sock")));
    rt.block_on(reg.get_info(InfoRequest {})).unwrap();
    // A refusal keeps it unready.
    let refuse = RegistrationStatus {
        plugin_registered: false,
        error: "version".into(),
    };
    rt.block_on(reg.notify_registration_status(refuse)).unwrap();
    assert_eq!(get(port, "/readyz").unwrap().0, 503);
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    rt.block_on(reg.notify_registration_status(ok)).unwrap();
    assert_eq!(get(port, "/readyz").unwrap().0, 200);

    // One claim prepared, one that does not exist (its prepare fails), one unprepared.
    let mut dra = DraPluginClient::new(channel(&rt, &d.join("plugins/dra.sock")));
    let claim = |name: &str, uid: &str| Claim {
        namespace: "team-a".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let r = rt
        .block_on(dra.node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                claim("notebook-gpu", UID),
                claim("missing", "00000000-0000-0000-0000-00000000dead"),
            ],
        }))
        .unwrap()
        .into_inner();
    assert_eq!(r.claims[UID].error, "", "{r:?}");
    let r = rt
        .block_on(dra.node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("notebook-gpu", UID)],
        }))
        .unwrap()
        .into_inner();
    assert_eq!(r.claims[UID].error, "", "{r:?}");

    let (code, m) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200, "{m}");
    let v = |s: &str| value(&m, s).unwrap_or_else(|| panic!("no {s} in\n{m}"));
    assert_eq!(v("cuquota_dra_operations_total{operation=\"prepare\"}"), 2.0);
    assert_eq!(
        v("cuquota_dra_operation_failures_total{operation=\"prepare\"}"),
        1.0
    );
    assert_eq!(v("cuquota_dra_operations_total{operation=\"unprepare\"}"), 1.0);
    assert_eq!(
        v("cuquota_dra_operation_duration_seconds_count{operation=\"prepare\"}"),
        2.0
    );
    assert_eq!(
        v("cuquota_dra_operation_duration_seconds_count{operation=\"unprepare\"}"),
        1.0
    );
    let sum = v("cuquota_dra_operation_duration_seconds_sum{operation=\"prepare\"}");
    assert!(sum > 0.0 && sum < 60.0, "prepare latency sum {sum}");
    assert_eq!(v("cuquota_dra_registered"), 1.0);
    assert!(m.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF:\n{m}");
}

/// The registration sockets in `dir` that answer GetInfo: (socket, the DRA endpoint it names).
fn registrations(rt: &tokio::runtime::Runtime, dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let info = rt.block_on(async {
            let path = p.clone();
            let ch = Endpoint::try_from("http://[::1]:1")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                    }
                }))
                .await
                .ok()?;
            RegistrationClient::new(ch).get_info(InfoRequest {}).await.ok()
        });
        if let Some(i) = info {
            out.push((p, i.into_inner().endpoint));
        }
    }
    out.sort();
    out
}

const POD_A: &str = "11111111-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const POD_B: &str = "22222222-bbbb-4bbb-8bbb-bbbbbbbbbbbb";

/// A surge rolling update: the old and the new pod's plugins run at once on one node. Each registers under
/// its own socket names (upstream's seamless upgrade: named after the pod UID), both answer, a claim prepared
/// through one is unprepared through the other, the two serialise on the state directory's lock, and the old
/// one removes its sockets when it stops.
#[test]
fn the_old_and_new_pod_of_a_surge_update_serve_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    node(d);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut old = spawn(d, None, Some(POD_A));
    let reg_a = d.join(format!("registry/gpu.cuquota.io-{POD_A}-reg.sock"));
    for _ in 0..1000 {
        if registrations(&rt, &d.join("registry")).len() == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _new = spawn(d, None, Some(POD_B));
    let mut regs = Vec::new();
    for _ in 0..500 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        regs = registrations(&rt, &d.join("registry"));
        if regs.len() == 2 {
            break;
        }
    }
    // Both instances answer, each under its own names.
    assert_eq!(regs.len(), 2, "registrations that answer: {regs:?}");
    assert_eq!(regs[0].0, reg_a);
    assert_eq!(
        regs[0].1,
        d.join(format!("plugins/dra-{POD_A}.sock")).display().to_string()
    );
    assert_eq!(
        regs[1].1,
        d.join(format!("plugins/dra-{POD_B}.sock")).display().to_string()
    );

    let claim = Claim {
        namespace: "team-a".into(),
        name: "notebook-gpu".into(),
        uid: UID.into(),
    };
    let spec = d.join(format!("cdi/cuquota.io-gpu-{UID}.json"));
    let prepare = |sock: &str| {
        let mut c = DraPluginClient::new(channel(&rt, &d.join(sock)));
        let r = rt
            .block_on(c.node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            }))
            .unwrap()
            .into_inner();
        assert_eq!(r.claims[UID].error, "", "{r:?}");
    };
    let unprepare = |sock: &str| {
        let mut c = DraPluginClient::new(channel(&rt, &d.join(sock)));
        let r = rt
            .block_on(c.node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: vec![claim.clone()],
            }))
            .unwrap()
            .into_inner();
        assert_eq!(r.claims[UID].error, "", "{r:?}");
    };
    let sock_a = format!("plugins/dra-{POD_A}.sock");
    let sock_b = format!("plugins/dra-{POD_B}.sock");
    prepare(&sock_a);
    assert!(spec.exists());
    unprepare(&sock_b);
    assert!(!spec.exists(), "unprepared through the new instance");

    // Serialised across the two processes: while the state directory's lock is held (here by the test), a
    // prepare waits.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(d.join("state/.lock"))
        .unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    }
    let (dd, c2) = (d.to_path_buf(), claim.clone());
    let waiting = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut c = DraPluginClient::new(channel(&rt, &dd.join(format!("plugins/dra-{POD_B}.sock"))));
        rt.block_on(c.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![c2] }))
            .unwrap()
            .into_inner()
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        !spec.exists(),
        "a prepare went ahead while the other instance held the lock"
    );
    drop(lock);
    let r = waiting.join().unwrap();
    assert_eq!(r.claims[UID].error, "", "{r:?}");
    assert!(spec.exists());

    // The old pod stops (SIGTERM): its sockets go, the new pod's stay and answer.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(old.0.id() as i32, libc::SIGTERM) };
    old.0.wait().unwrap();
    assert!(
        !reg_a.exists() && !d.join(&sock_a).exists(),
        "the old pod's sockets are left"
    );
    let regs = registrations(&rt, &d.join("registry"));
    assert_eq!(regs.len(), 1, "{regs:?}");
    unprepare(&sock_b);
}

/// The plugin on the simulator's NVML (two GPUs), probing every second, with `env` (the simulator's knobs);
/// the first `n` lists it streams to the kubelet's health API, as (device, status) pairs.
fn health_stream(env: &[(&str, &str)], n: usize) -> Vec<Vec<(String, String)>> {
    use cuquota_dra::proto::health::dra_resource_health_client::DraResourceHealthClient;
    use cuquota_dra::proto::health::{HealthStatus, NodeWatchResourcesRequest};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    node(d);
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuquota-dra-plugin"));
    c.args(["--node", "node-1", "--no-driver-files", "--health-seconds", "1"])
        .arg("--claims-dir")
        .arg(d.join("claims"))
        .arg("--state-dir")
        .arg(d.join("state"))
        .arg("--cdi-dir")
        .arg(d.join("cdi"))
        .arg("--plugin-dir")
        .arg(d.join("plugins"))
        .arg("--registrar-dir")
        .arg(d.join("registry"))
        .env_remove("POD_UID")
        .env("CUQUOTA_LIBNVML", shim_tests::sim_lib())
        .env("CUDASIM_STATE", d.join("sim.state"))
        .env("CUDASIM_DEVICES", "2")
        .env("CUDASIM_MEMORY", "80g,16g")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c.envs(env.iter().copied());
    let _plugin = Killed(c.spawn().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut h = DraResourceHealthClient::new(channel(&rt, &d.join("plugins/dra.sock")));
    rt.block_on(async {
        let mut s = h
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let mut out = Vec::new();
        while out.len() < n {
            let m = tokio::time::timeout(Duration::from_secs(30), s.message())
                .await
                .expect("a list within 30 s")
                .unwrap()
                .expect("the stream goes on");
            out.push(
                m.devices
                    .iter()
                    .map(|dh| {
                        let id = dh.device.clone().unwrap();
                        assert_eq!(id.pool_name, "node-1");
                        let st = HealthStatus::try_from(dh.health)
                            .unwrap()
                            .as_str_name()
                            .to_string();
                        (id.device_name, st)
                    })
                    .collect(),
            );
        }
        out
    })
}

use std::time::Duration;

/// A GPU that falls off the bus (NVML answers `NVML_ERROR_GPU_IS_LOST`, injected in the simulator from the
/// plugin's 9th `nvmlDeviceGetMemoryInfo` on: 2 at start, 2 per probe, so the first three probes answer) is
/// streamed to the kubelet's health API as UNHEALTHY, never HEALTHY again; control: without the fault both
/// are HEALTHY and never UNHEALTHY.
#[test]
fn a_gpu_that_falls_off_the_bus_is_reported_unhealthy_to_the_kubelet() {
    let healthy = |l: &Vec<(String, String)>| l.len() == 2 && l.iter().all(|d| d.1 == "HEALTHY");
    let unhealthy = |l: &Vec<(String, String)>| l.len() == 2 && l.iter().all(|d| d.1 == "UNHEALTHY");
    // Control.
    let lists = health_stream(&[], 4);
    assert!(healthy(&lists[3]), "{lists:?}");
    assert!(
        !lists.iter().any(|l| l.iter().any(|d| d.1 == "UNHEALTHY")),
        "{lists:?}"
    );
    // The GPUs lost after the first probe.
    let lists = health_stream(&[("CUDASIM_FAULT", "nvmlDeviceGetMemoryInfo:9+:GPU_IS_LOST")], 8);
    let first_lost = lists
        .iter()
        .position(unhealthy)
        .unwrap_or_else(|| panic!("{lists:?}"));
    assert!(
        lists[first_lost..].iter().all(unhealthy),
        "stays unhealthy: {lists:?}"
    );
    // Before the loss (when the stream began in time to see it) the GPUs were HEALTHY.
    assert!(lists[..first_lost].iter().all(|l| !unhealthy(l)), "{lists:?}");
    assert!(lists[0][0].0.starts_with("gpu-"), "{lists:?}");
}

/// A critical XID error on the second GPU (79, fallen off the bus, raised by the simulator at the plugin's
/// second event wait) makes that GPU UNHEALTHY for good while the first stays HEALTHY; control: an
/// application's XID (13) on the same GPU leaves both HEALTHY.
#[test]
fn a_critical_xid_makes_its_gpu_unhealthy_and_an_applications_xid_does_not() {
    let lists = health_stream(&[("CUDASIM_XID", "1:79@2")], 6);
    let lost = lists
        .iter()
        .position(|l| l.len() == 2 && l[1].1 == "UNHEALTHY")
        .unwrap_or_else(|| panic!("{lists:?}"));
    assert!(
        lists[lost..].iter().all(|l| l[1].1 == "UNHEALTHY"),
        "stays unhealthy: {lists:?}"
    );
    assert!(
        lists.iter().all(|l| l[0].1 != "UNHEALTHY"),
        "the other GPU: {lists:?}"
    );
    assert_eq!(lists.last().unwrap()[0].1, "HEALTHY", "{lists:?}");
    // Control.
    let lists = health_stream(&[("CUDASIM_XID", "1:13@2")], 6);
    assert!(
        lists.iter().all(|l| l.iter().all(|d| d.1 != "UNHEALTHY")),
        "{lists:?}"
    );
    assert!(
        lists.last().unwrap().iter().all(|d| d.1 == "HEALTHY"),
        "{lists:?}"
    );
}
