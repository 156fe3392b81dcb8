//! The test node: a plugin serving the kubelet's gRPC APIs on unix sockets in a temporary directory, and a
//! client for them (what the kubelet calls).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cuquota_dra::inventory::{Gpu, Inventory};
use cuquota_dra::prepare::Layout;
use cuquota_dra::proto::dra::dra_plugin_client::DraPluginClient;
use cuquota_dra::proto::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use cuquota_dra::server::{serve, Plugin};
use cuquota_dra::source::DirSource;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

pub(crate) const UID: &str = "5b9c3f2e-1d4a-4c8e-9f00-0a1b2c3d4e5f";
pub(crate) const GPU: &str = "GPU-0badc0de-1111-2222-3333-444455556666";
pub(crate) const POD_UID: &str = "aaaabbbb-cccc-dddd-eeee-ffff00001111";

pub(crate) fn fixture() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/claim.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A node: its directories and a running plugin.
pub(crate) struct Node {
    pub dir: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
    pub layout: Layout,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Node {
    pub(crate) fn new() -> Node {
        Node::with(|_| {})
    }

    /// A node whose layout `edit` changes before the plugin starts.
    pub(crate) fn with(edit: impl FnOnce(&mut Layout)) -> Node {
        let dir = tempfile::tempdir().unwrap();
        for d in ["claims/team-a", "cdi", "agent", "lib", "cgroup", "kubelet"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("lib/libcuquota.so"), b"not really").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut layout = Layout {
            state_dir: dir.path().join("state"),
            cdi_dir: dir.path().join("cdi"),
            agent_dir: Some(dir.path().join("agent")),
            priority_dir: None,
            library: dir.path().join("lib/libcuquota.so"),
            cgroup_root: dir.path().join("cgroup"),
            enforce_memory: "kill".into(),
            enforce_sm: "throttle".into(),
            extra_mounts: Vec::new(),
            extra_env: vec!["EXTRA=1".into()],
            device_nodes: Vec::new(),
            driver: None,
        };
        edit(&mut layout);
        let mut n = Node {
            dir,
            rt,
            layout,
            stop: None,
            task: None,
        };
        n.put_claim("notebook-gpu", &fixture());
        n.start();
        n
    }

    pub(crate) fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub(crate) fn put_claim(&self, name: &str, v: &serde_json::Value) {
        std::fs::write(
            self.p(&format!("claims/team-a/{name}.json")),
            serde_json::to_vec(v).unwrap(),
        )
        .unwrap();
    }

    pub(crate) fn start(&mut self) {
        let inventory = Inventory {
            pool: "node-1".into(),
            gpus: vec![
                Gpu::new(GPU, 80 << 30, "NVIDIA H100 80GB HBM3").unwrap(),
                Gpu::new(
                    "GPU-00000000-0000-0000-0000-000000000002",
                    80 << 30,
                    "NVIDIA H100 80GB HBM3",
                )
                .unwrap(),
            ],
        };
        let plugin = Arc::new(Plugin::new(
            "gpu.cuquota.io".into(),
            inventory,
            self.layout.clone(),
            Box::new(DirSource(self.p("claims"))),
            self.p("kubelet/plugins/gpu.cuquota.io/dra.sock"),
        ));
        let reg = self.p("kubelet/plugins_registry/gpu.cuquota.io-reg.sock");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let _guard = self.rt.enter();
        self.task = Some(tokio::spawn(async move {
            serve(plugin, &reg, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        }));
        self.stop = Some(tx);
    }

    /// Stops the plugin (as a restart's first half).
    pub(crate) fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            self.rt.block_on(t).unwrap();
        }
        // So that a client waits for the next run's sockets.
        let _ = std::fs::remove_file(self.p("kubelet/plugins/gpu.cuquota.io/dra.sock"));
        let _ = std::fs::remove_file(self.p("kubelet/plugins_registry/gpu.cuquota.io-reg.sock"));
    }

    pub(crate) fn channel(&self, sock: &str) -> Channel {
        let path = self.p(sock);
        self.rt.block_on(async {
            for _ in 0..1000 {
                if path.exists() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let path = path.clone();
            Endpoint::try_from("http://[::1]:1")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                    }
                }))
                .await
                .unwrap()
        })
    }

    pub(crate) fn dra(&self) -> DraPluginClient<Channel> {
        DraPluginClient::new(self.channel("kubelet/plugins/gpu.cuquota.io/dra.sock"))
    }

    pub(crate) fn prepare(
        &self,
        names: &[(&str, &str)],
    ) -> std::collections::HashMap<String, cuquota_dra::proto::dra::NodePrepareResourceResponse> {
        let mut c = self.dra();
        let req = NodePrepareResourcesRequest {
            claims: names
                .iter()
                .map(|(name, uid)| Claim {
                    namespace: "team-a".into(),
                    name: (*name).into(),
                    uid: (*uid).into(),
                })
                .collect(),
        };
        self.rt
            .block_on(c.node_prepare_resources(req))
            .unwrap()
            .into_inner()
            .claims
    }

    pub(crate) fn unprepare(&self, uid: &str) -> String {
        let mut c = self.dra();
        let req = NodeUnprepareResourcesRequest {
            claims: vec![Claim {
                namespace: "team-a".into(),
                name: "notebook-gpu".into(),
                uid: uid.into(),
            }],
        };
        let mut r = self
            .rt
            .block_on(c.node_unprepare_resources(req))
            .unwrap()
            .into_inner()
            .claims;
        r.remove(uid).expect("an answer for the claim").error
    }

    pub(crate) fn cdi_spec(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.p(&format!("cdi/cuquota.io-gpu-{UID}.json"))).unwrap())
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}
