//! The kubelet's two gRPC services on unix sockets: plugin registration (the kubelet finds the socket in
//! `plugins_registry/` and asks GetInfo) and the DRA service (NodePrepareResources / NodeUnprepareResources).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::inventory::Inventory;
use crate::prepare::{ClaimRef, Layout, Prepared};
use crate::proto::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::proto::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::source::ClaimSource;

/// The DRA service version the plugin registers (`k8s.io/kubelet/pkg/apis/dra/v1`).
pub const DRA_SERVICE_VERSION: &str = "v1.DRAPlugin";
/// The plugin type the kubelet's DRA manager handles.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// The node plugin: what it knows and owns.
#[derive(Debug)]
pub struct Plugin {
    /// The driver name.
    pub driver: String,
    /// The GPUs.
    pub inventory: Inventory,
    /// The files it writes.
    pub layout: Layout,
    /// Where claims are read.
    pub source: Box<dyn ClaimSource>,
    /// The DRA socket, as registered.
    pub endpoint: PathBuf,
    /// The devices' health, served to the kubelet's health API when set ([`crate::device_health`]).
    pub health: Option<tokio::sync::watch::Receiver<Vec<crate::proto::health::DeviceHealth>>>,
    /// Counters, latencies and readiness (`--health-listen`).
    pub metrics: Arc<crate::health::Metrics>,
    /// Serialises prepares and unprepares (the kubelet may call concurrently; the files are per claim, the
    /// marker and directories shared).
    lock: Mutex<()>,
}

impl Plugin {
    /// A plugin.
    pub fn new(
        driver: String,
        inventory: Inventory,
        layout: Layout,
        source: Box<dyn ClaimSource>,
        endpoint: PathBuf,
    ) -> Plugin {
        Plugin {
            driver,
            inventory,
            layout,
            source,
            endpoint,
            health: None,
            metrics: Arc::default(),
            lock: Mutex::new(()),
        }
    }

    /// Held while claims' files change: this process's mutex, then an exclusive `flock` on STATE_DIR/.lock,
    /// which serialises the two instances of a surge rolling update (upstream's kubelet plugin does the same:
    /// the kubelet may prepare a claim through one and unprepare it through the other). A lock file that
    /// cannot be opened is logged; the state directory's writes then fail on their own.
    fn hold(&self) -> Held<'_> {
        let mutex = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.layout.state_dir.join(".lock");
        let file = std::fs::create_dir_all(&self.layout.state_dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
            })
            .and_then(|f| {
                use std::os::fd::AsRawFd;
                loop {
                    // SAFETY: a valid open descriptor; the lock is released when the file is closed.
                    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                        return Ok(f);
                    }
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            })
            .map_err(|e| eprintln!("cuquota-dra-plugin: {}: {e}", path.display()))
            .ok();
        Held {
            _file: file,
            _mutex: mutex,
        }
    }

    /// Prepares one claim: the kubelet's per-claim answer (an error string when it cannot be honoured).
    pub async fn prepare_one(&self, c: ClaimRef) -> NodePrepareResourceResponse {
        let fail = |error: String| NodePrepareResourceResponse {
            devices: Vec::new(),
            error: format!("cuquota: claim {}/{}: {error}", c.namespace, c.name),
        };
        let answer = |p: Prepared| NodePrepareResourceResponse {
            devices: p
                .devices
                .into_iter()
                .map(|d| Device {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                    share_id: d.share_id,
                })
                .collect(),
            error: String::new(),
        };
        // Read every time, a prepared claim too: `reservedFor` grows when another pod shares the claim.
        let rc = match self.source.get(&c.namespace, &c.name).await {
            Ok(rc) => rc,
            Err(e) => {
                // The API unreachable (a node rebooting before the control plane answers): a claim prepared
                // before is answered from its checkpoint.
                let _g = self.hold();
                return match self.layout.prepared_again(&c, None) {
                    Some(Ok(p)) => answer(p),
                    Some(Err(e)) => fail(e.to_string()),
                    None => fail(format!("cannot read the ResourceClaim: {e}")),
                };
            }
        };
        if rc.metadata.uid == c.uid {
            let _g = self.hold();
            match self.layout.prepared_again(&c, Some(rc.pods())) {
                Some(Ok(p)) => return answer(p),
                Some(Err(e)) => return fail(e.to_string()),
                None => {}
            }
        }
        if rc.metadata.uid != c.uid {
            return fail(format!(
                "the ResourceClaim's UID is {:?}, the kubelet asked for {:?} (deleted and re-created?)",
                rc.metadata.uid, c.uid
            ));
        }
        let grants = match rc.grants(&self.driver, &self.inventory) {
            Ok(g) => g,
            Err(e) => return fail(e.to_string()),
        };
        let _g = self.hold();
        match self.layout.prepare(&c, &grants) {
            Ok(p) => answer(p),
            Err(e) => fail(e.to_string()),
        }
    }

    /// Run at start, before serving: CDI specs written again from the checkpoints, leftovers removed
    /// ([`Layout::restore`]). Returns the claims kept.
    pub fn restore(&self) -> Vec<Prepared> {
        let (kept, log) = {
            let _g = self.hold();
            self.layout.restore()
        };
        for l in log {
            eprintln!("cuquota-dra-plugin: {l}");
        }
        kept
    }

    /// The preparations of `kept` claims the source says are gone, removed (the kubelet only unprepares claims
    /// it remembers; a claim deleted while the node was down would keep its files for ever).
    pub async fn reap_gone(&self, kept: Vec<Prepared>) {
        for p in kept {
            match self.source.exists(&p.namespace, &p.name, &p.uid).await {
                Ok(false) => {
                    let _g = self.hold();
                    // Prepared again meanwhile: not stale.
                    if self.layout.prepared(&p.uid).as_ref() != Some(&p) {
                        continue;
                    }
                    match self.layout.unprepare(&p.uid) {
                        Ok(()) => eprintln!(
                            "cuquota-dra-plugin: claim {}/{} ({}) is gone: removed its preparation",
                            p.namespace, p.name, p.uid
                        ),
                        Err(e) => eprintln!("cuquota-dra-plugin: claim {}: {e}", p.uid),
                    }
                }
                Ok(true) => {}
                Err(e) => eprintln!(
                    "cuquota-dra-plugin: claim {}/{}: kept, its ResourceClaim cannot be read: {e}",
                    p.namespace, p.name
                ),
            }
        }
    }

    fn unprepare_one(&self, uid: &str) -> NodeUnprepareResourceResponse {
        let _g = self.hold();
        NodeUnprepareResourceResponse {
            error: self
                .layout
                .unprepare(uid)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        }
    }
}

/// What [`Plugin::hold`] holds (the file, closed first, releases the `flock`).
struct Held<'a> {
    _file: Option<std::fs::File>,
    _mutex: std::sync::MutexGuard<'a, ()>,
}

/// The DRA service.
#[derive(Debug, Clone)]
pub struct DraService(pub Arc<Plugin>);

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in req.into_inner().claims {
            let r = ClaimRef {
                namespace: c.namespace,
                name: c.name,
                uid: c.uid,
            };
            let uid = r.uid.clone();
            let start = std::time::Instant::now();
            let resp = self.0.prepare_one(r).await;
            self.0
                .metrics
                .observe("prepare", !resp.error.is_empty(), start.elapsed());
            if !resp.error.is_empty() {
                eprintln!("cuquota-dra-plugin: prepare: {}", resp.error);
            }
            claims.insert(uid, resp);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let start = std::time::Instant::now();
                let r = self.0.unprepare_one(&c.uid);
                self.0
                    .metrics
                    .observe("unprepare", !r.error.is_empty(), start.elapsed());
                (c.uid, r)
            })
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// The registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService(pub Arc<Plugin>);

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.0.driver.clone(),
            endpoint: self.0.endpoint.display().to_string(),
            supported_versions: vec![DRA_SERVICE_VERSION.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        self.0.metrics.set_registered(s.plugin_registered);
        if s.plugin_registered {
            eprintln!("cuquota-dra-plugin: registered with the kubelet");
        } else {
            eprintln!(
                "cuquota-dra-plugin: the kubelet refused the registration: {}",
                s.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds a unix socket, replacing a stale one (a socket file left by an earlier run).
pub fn bind(path: &Path) -> std::io::Result<UnixListenerStream> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(UnixListenerStream::new(UnixListener::bind(path)?))
}

/// Serves both services until `shutdown` resolves: the DRA service on `plugin.endpoint`, registration on
/// `registration_socket`; claims whose pods' cgroups appear get their descriptors every second.
pub async fn serve(
    plugin: Arc<Plugin>,
    registration_socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let kept = plugin.restore();
    let dra = bind(&plugin.endpoint)?;
    let reg = bind(registration_socket)?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let health = plugin.health.clone().map(|h| {
        crate::proto::health::dra_resource_health_server::DraResourceHealthServer::new(
            crate::device_health::HealthService(h),
        )
    });
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(DraService(plugin.clone())))
        .add_optional_service(health)
        .serve_with_incoming_shutdown(dra, wait(rx.clone()));
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(RegistrationService(plugin.clone())))
        .serve_with_incoming_shutdown(reg, wait(rx.clone()));
    let p = plugin.clone();
    let mut stop = rx.clone();
    let resolver = async move {
        tokio::select! {
            () = p.reap_gone(kept) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => p.layout.resolve_pending(),
                _ = stop.wait_for(|v| *v) => return,
            }
        }
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });
    let (a, b, ()) = tokio::join!(dra_server, reg_server, resolver);
    // Gone with this instance: the kubelet drops a registration whose socket is removed, and the instance
    // that replaces it in a surge update serves under its own names.
    let _ = std::fs::remove_file(registration_socket);
    let _ = std::fs::remove_file(&plugin.endpoint);
    a?;
    b?;
    Ok(())
}
