//! `cuquota-dra-plugin`: the DRA node plugin (docs/kubernetes.md).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use cuquota_dra::gpu_access::DriverFiles;
use cuquota_dra::inventory::{self, Gpu, Inventory};
use cuquota_dra::kube_api::KubeSource;
use cuquota_dra::prepare::{ExtraMount, Layout};
use cuquota_dra::server::{serve, Plugin};
use cuquota_dra::slice_sync::{SliceSync, Synced};
use cuquota_dra::source::{ClaimSource, DirSource};

/// cuquota's Kubernetes DRA node plugin: registers with the kubelet and, for each allocated ResourceClaim,
/// writes the limits file, usage file, agent descriptor and CDI spec that enforce the granted memory and SM share.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The driver name (DeviceClass selector `device.driver`)
    #[arg(long, default_value = cuquota_dra::DRIVER_NAME)]
    driver: String,
    /// This node's name: the ResourceSlice pool
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// A GPU of this node: UUID=MEMORY[=MODEL] (memory a quantity, 80Gi); repeat per GPU. Default: every GPU
    /// NVML lists (CUQUOTA_LIBNVML or libnvidia-ml.so.1)
    #[arg(long = "gpu", value_name = "UUID=MEMORY[=MODEL]", value_parser = Gpu::parse_arg)]
    gpus: Vec<Gpu>,
    /// Read ResourceClaims from DIR/<namespace>/<name>.json (what `kubectl get resourceclaim -o json` prints)
    /// instead of the API server, and publish no ResourceSlice (a node without a cluster; tests)
    #[arg(long, value_name = "DIR")]
    claims_dir: Option<PathBuf>,
    /// Print this node's ResourceSlice as JSON and exit
    #[arg(long)]
    print_resource_slice: bool,
    /// Seconds between checks that the node's ResourceSlice is still what the plugin published (the kubelet
    /// deletes it when it starts; it is published again when gone or changed)
    #[arg(long, env = "CUQUOTA_DRA_RESYNC_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    resync_seconds: u64,
    /// The plugin's state directory (per-claim limits and usage files, checkpoints)
    #[arg(long, default_value = "/var/lib/cuquota/dra")]
    state_dir: PathBuf,
    /// Where CDI specs are written
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The agent's descriptor directory (`cuquota agent --containers`); none = no descriptors
    #[arg(long, value_name = "DIR")]
    agent_dir: Option<PathBuf>,
    /// The node's priority directory (docs/priority.md): a claim with a priority or reserve gets its own file
    /// there, mounted read-write, and the directory read-only [default: STATE_DIR/priority]
    #[arg(long, value_name = "DIR")]
    priority_dir: Option<PathBuf>,
    /// The agent's memory action in descriptors: report or kill
    #[arg(long, default_value = "report", value_parser = ["report", "kill"])]
    enforce_memory: String,
    /// The agent's SM action in descriptors: report, throttle or kill
    #[arg(long, default_value = "report", value_parser = ["report", "throttle", "kill"])]
    enforce_sm: String,
    /// The host's libcuquota.so (mounted read-only into every claim's containers)
    #[arg(long, default_value = "/var/lib/cuquota/lib/libcuquota.so")]
    library: PathBuf,
    /// The cgroup filesystem (pods' cgroups are looked for under it)
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// Another mount for every claim, read-only unless :rw (e.g. driver libraries no other CDI device brings)
    #[arg(long = "mount", value_name = "HOST:CONTAINER[:rw]", value_parser = ExtraMount::parse)]
    mounts: Vec<ExtraMount>,
    /// More environment for every claim: NAME=VALUE
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// A device node every claim's containers need (e.g. /dev/nvidiactl), when no other CDI device adds it
    #[arg(long = "device-node", value_name = "PATH")]
    device_nodes: Vec<PathBuf>,
    /// Where this process sees the node's `/` (a hostPath mount of its pod): NVIDIA's CDI spec, the device
    /// nodes and the driver libraries are looked for under it; specs name the host's paths
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// The NVIDIA driver's root on the node (the GPU operator's driver container: /run/nvidia/driver)
    #[arg(long, default_value = "/")]
    driver_root: PathBuf,
    /// The device nodes are DEV_ROOT/dev/nvidia* on the node
    #[arg(long, default_value = "/")]
    dev_root: PathBuf,
    /// A node directory where NVIDIA's CDI spec may be (its devices named by UUID are answered beside the
    /// claim's); repeat. Default: /etc/cdi and /var/run/cdi
    #[arg(long = "nvidia-cdi-dir", value_name = "DIR")]
    nvidia_cdi_dirs: Vec<PathBuf>,
    /// Add no device nodes or driver libraries to claims (something else brings them: --mount, --device-node)
    #[arg(long)]
    no_driver_files: bool,
    /// The name of the SM-share capacity in the ResourceSlice: sm, or HAMi's cores (claims written for HAMi's
    /// DRA driver carry over); claims are read under either
    #[arg(long, default_value = "sm", value_parser = ["sm", "cores"])]
    sm_capacity_name: String,
    /// The kubelet's plugin directory for this driver (the DRA socket dra.sock goes there)
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpu.cuquota.io")]
    plugin_dir: PathBuf,
    /// Serve GET /healthz (liveness), /readyz (registered with the kubelet) and /metrics (prepares, failures,
    /// latencies; no claim or tenant named) on this address, HOST:PORT
    #[arg(long, value_name = "ADDR")]
    health_listen: Option<std::net::SocketAddr>,
    /// The kubelet's registration directory (the socket <driver>-reg.sock goes there)
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registrar_dir: PathBuf,
    /// Seconds between probes of every GPU through NVML, whose health the kubelet's DRA health API gets
    /// (0: no probes, and no health service)
    #[arg(long, default_value_t = 10)]
    health_seconds: u64,
    /// This pod's UID: the sockets are named after it (<driver>-<UID>-reg.sock, dra-<UID>.sock), so that
    /// the old and the new pod of a surge rolling update serve side by side (the kubelet, 1.33+, uses either)
    #[arg(long, env = "POD_UID", value_parser = pod_uid)]
    pod_uid: Option<String>,
}

/// The node's GPUs: as given, or every GPU NVML lists, with what NVML and the node's sysfs (under
/// `host_root`) say of each.
fn gpus(given: Vec<Gpu>, host_root: &std::path::Path) -> anyhow::Result<Vec<Gpu>> {
    if !given.is_empty() {
        return Ok(given);
    }
    let nvml = cuquota_ffi::nvml_loader::Nvml::load()?;
    let driver_version = nvml.driver_version().as_deref().and_then(inventory::semver);
    let gpus = nvml
        .gpus()?
        .into_iter()
        .map(|g| {
            let d = nvml.details(&g);
            let mut gpu = Gpu::new(
                &g.uuid,
                g.memory_total_bytes,
                d.product_name.as_deref().unwrap_or("NVIDIA GPU"),
            )?;
            let pci_bus_id = d
                .pci
                .map(|(dom, bus, dev)| format!("{dom:04x}:{bus:02x}:{dev:02x}.0"));
            gpu.details = inventory::Details {
                architecture: d.architecture,
                compute_capability: d.compute_capability.map(|(a, b)| format!("{a}.{b}.0")),
                driver_version: driver_version.clone(),
                pcie_root: pci_bus_id
                    .as_deref()
                    .and_then(|id| inventory::pcie_root(host_root, id)),
                pci_bus_id,
            };
            Ok(gpu)
        })
        .collect::<Result<Vec<_>, inventory::GpuError>>()?;
    if gpus.is_empty() {
        anyhow::bail!("NVML ({}) lists no GPU", nvml.library());
    }
    Ok(gpus)
}

/// A pod UID as a socket-name part: letters, digits and `-` (a UID is a UUID), at most 64.
fn pod_uid(s: &str) -> anyhow::Result<String> {
    if s.is_empty() || s.len() > 64 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        anyhow::bail!("{s:?} is not a pod UID (letters, digits and -)");
    }
    Ok(s.to_string())
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    let gpus = match gpus(a.gpus, &a.host_root) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("cuquota-dra-plugin: the node's GPUs: {e:#} (or name them with --gpu)");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = cuquota_dra::capacity_names::publish_sm_as(&a.sm_capacity_name) {
        eprintln!("cuquota-dra-plugin: --sm-capacity-name: {e}");
        return std::process::ExitCode::from(2);
    }
    let inventory = Inventory { pool: a.node, gpus };
    if a.print_resource_slice {
        let s = cuquota_dra::slice::resource_slice(&a.driver, &inventory, 1);
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return std::process::ExitCode::SUCCESS;
    }
    let layout = Layout {
        state_dir: a.state_dir,
        cdi_dir: a.cdi_dir,
        agent_dir: a.agent_dir,
        priority_dir: a.priority_dir,
        library: a.library,
        cgroup_root: a.cgroup_root,
        enforce_memory: a.enforce_memory,
        enforce_sm: a.enforce_sm,
        extra_mounts: a.mounts,
        extra_env: a.env,
        device_nodes: a.device_nodes,
        driver: (!a.no_driver_files).then(|| {
            let mut d = DriverFiles::host();
            d.host_root = a.host_root;
            d.driver_root = a.driver_root;
            d.dev_root = a.dev_root;
            if !a.nvidia_cdi_dirs.is_empty() {
                d.cdi_dirs = a.nvidia_cdi_dirs;
            }
            d
        }),
    };
    let (reg, endpoint) = match &a.pod_uid {
        Some(uid) => (
            a.registrar_dir.join(format!("{}-{uid}-reg.sock", a.driver)),
            a.plugin_dir.join(format!("dra-{uid}.sock")),
        ),
        None => (
            a.registrar_dir.join(format!("{}-reg.sock", a.driver)),
            a.plugin_dir.join("dra.sock"),
        ),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cuquota-dra-plugin: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let run = async {
        let monitor = match a.health_seconds {
            0 => None,
            s => Some(
                cuquota_dra::device_health::monitor(inventory.clone(), std::time::Duration::from_secs(s))
                    .context("device health")?,
            ),
        };
        let source: Box<dyn ClaimSource> = match a.claims_dir {
            Some(dir) => Box::new(DirSource(dir)),
            None => {
                // In the cluster (service account) or from a kubeconfig.
                let client = kube::Client::try_default().await.context("the API server")?;
                let mut sync = SliceSync::new(client.clone(), &a.driver, inventory.clone());
                let period = std::time::Duration::from_secs(a.resync_seconds);
                let unhealthy = monitor.as_ref().map(|m| m.unhealthy.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(period);
                    loop {
                        tick.tick().await;
                        if let Some(u) = &unhealthy {
                            sync.set_unhealthy(&u.borrow());
                        }
                        match sync.sync().await {
                            Ok(Synced::Unchanged) => {}
                            Ok(s) => eprintln!("cuquota-dra-plugin: ResourceSlice {}: {s:?}", sync.name()),
                            Err(e) => eprintln!("cuquota-dra-plugin: ResourceSlice {}: {e}", sync.name()),
                        }
                    }
                });
                Box::new(KubeSource(client))
            }
        };
        let mut plugin = Plugin::new(a.driver, inventory, layout, source, endpoint);
        plugin.health = monitor.map(|m| m.health);
        let plugin = Arc::new(plugin);
        if let Some(addr) = a.health_listen {
            // On this runtime, the one that serves the kubelet: a stuck runtime fails the liveness probe.
            let l = cuquota_dra::health::bind(addr)?;
            tokio::spawn(cuquota_dra::health::serve(l, plugin.metrics.clone()));
        }
        serve(plugin, &reg, shutdown)
            .await
            .map_err(|e| anyhow::anyhow!(e))
    };
    match rt.block_on(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuquota-dra-plugin: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
