//! Device health from NVML, streamed to the kubelet through its DRA resource health API
//! (`v1alpha1.DRAResourceHealth/NodeWatchResources`, kubelet 1.34+ with the ResourceHealthStatus gate; the
//! kubelet shows it in the pod's status). Each period every GPU is probed by UUID
//! (`nvmlDeviceGetHandleByUUID`, `nvmlDeviceGetMemoryInfo`): `NVML_ERROR_GPU_IS_LOST` (fallen off the bus) is
//! UNHEALTHY, another error or an NVML that does not load UNKNOWN, an answer HEALTHY; between probes the
//! thread waits on NVML's critical XID events, and a GPU with a critical XID is UNHEALTHY from then on.
//! The same verdict taints the device in the node's ResourceSlice (`slice_sync`), so the scheduler places no
//! new claim on it: the health stream only reaches the pod's status.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::inventory::Inventory;
use crate::proto::health::dra_resource_health_server::DraResourceHealth;
use crate::proto::health::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};

/// Every device of `inv` with `status` at `now` (Unix seconds).
fn all(inv: &Inventory, status: impl Fn(&str) -> HealthStatus, now: i64) -> Vec<DeviceHealth> {
    inv.gpus
        .iter()
        .map(|g| DeviceHealth {
            device: Some(DeviceIdentifier {
                pool_name: inv.pool.clone(),
                device_name: g.name.clone(),
            }),
            health: status(&g.uuid) as i32,
            last_updated_time: now,
        })
        .collect()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// XIDs that name an application's fault, not the GPU's (NVIDIA's device plugin skips the same by default):
/// 13 graphics engine exception, 31 MMU fault, 43 a stopped channel, 45 preemptive cleanup, 68 video
/// processor exception, 109 context switch timeout.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// What the probe thread publishes.
#[derive(Debug)]
pub struct Monitor {
    /// The latest complete list, for the kubelet's health stream.
    pub health: watch::Receiver<Vec<DeviceHealth>>,
    /// The UNHEALTHY devices by name, each with why (`gpu-lost`, `xid-79`): the slice's taints.
    pub unhealthy: watch::Receiver<Vec<(String, String)>>,
}

/// Starts the probe thread (NVML is not `Send`: it lives there); the health list is UNKNOWN until the first
/// probe. A GPU that reported a critical XID (one not in [`APPLICATION_XIDS`]) stays UNHEALTHY until the
/// plugin restarts, as NVIDIA's plugins keep it.
pub fn monitor(inv: Inventory, period: Duration) -> std::io::Result<Monitor> {
    let (tx, rx) = watch::channel(all(&inv, |_| HealthStatus::Unknown, unix_now()));
    let (why_tx, why_rx) = watch::channel(Vec::new());
    std::thread::Builder::new()
        .name("device-health".into())
        .spawn(move || {
            let mut xid_lost: Vec<(String, u64)> = Vec::new();
            let mut last: Vec<i32> = Vec::new();
            loop {
                let nvml = cuquota_ffi::nvml_loader::Nvml::load()
                    .map_err(|e| eprintln!("cuquota-dra-plugin: device health: {e}"))
                    .ok();
                let uuids: Vec<String> = inv.gpus.iter().map(|g| g.uuid.clone()).collect();
                let events = nvml.as_ref().and_then(|n| {
                    n.xid_events(&uuids)
                        .map_err(|e| eprintln!("cuquota-dra-plugin: device health: no XID events: {e}"))
                        .ok()
                });
                for uuid in events.iter().flat_map(|e| e.unwatched()) {
                    cuquota_core::log!(cuquota_core::log::Level::Warn, "NVML: no XID events for {uuid}");
                }
                loop {
                    let why = std::cell::RefCell::new(Vec::new());
                    let list = all(
                        &inv,
                        |uuid| {
                            if let Some((_, xid)) = xid_lost.iter().find(|u| u.0 == uuid) {
                                why.borrow_mut().push((uuid.to_string(), format!("xid-{xid}")));
                                return HealthStatus::Unhealthy;
                            }
                            match nvml.as_ref().map(|n| n.probe(uuid)) {
                                Some(Ok(())) => HealthStatus::Healthy,
                                Some(Err(e))
                                    if e.status()
                                        == Some(cuquota_ffi::nvml::nvmlReturn_t::ERROR_GPU_IS_LOST) =>
                                {
                                    why.borrow_mut().push((uuid.to_string(), "gpu-lost".into()));
                                    HealthStatus::Unhealthy
                                }
                                _ => HealthStatus::Unknown,
                            }
                        },
                        unix_now(),
                    );
                    let why: Vec<(String, String)> = why
                        .into_inner()
                        .into_iter()
                        .filter_map(|(uuid, r)| {
                            Some((inv.gpus.iter().find(|g| g.uuid == uuid)?.name.clone(), r))
                        })
                        .collect();
                    why_tx.send_if_modified(|w| {
                        let changed = *w != why;
                        *w = why;
                        changed
                    });
                    let now: Vec<i32> = list.iter().map(|d| d.health).collect();
                    if now != last {
                        for (g, h) in inv.gpus.iter().zip(&now) {
                            let name = HealthStatus::try_from(*h).map_or("?", |s| s.as_str_name());
                            eprintln!(
                                "cuquota-dra-plugin: device health: {} ({}): {name}",
                                g.name, g.uuid
                            );
                        }
                        last = now;
                    }
                    // A complete list every period: the kubelet counts a device it stops hearing of as Unknown.
                    if tx.send(list).is_err() {
                        return;
                    }
                    // The period, or less when an XID error arrives.
                    match &events {
                        Some(ev) => match ev.wait(period.as_millis().min(u32::MAX as u128) as u32) {
                            Ok(Some((uuid, xid))) if !APPLICATION_XIDS.contains(&xid) => {
                                eprintln!("cuquota-dra-plugin: device health: {uuid}: critical XID {xid}");
                                if !xid_lost.iter().any(|u| u.0 == uuid) {
                                    xid_lost.push((uuid, xid));
                                }
                            }
                            Ok(Some((uuid, xid))) => {
                                eprintln!(
                                    "cuquota-dra-plugin: device health: {uuid}: XID {xid} (an application's)"
                                )
                            }
                            Ok(None) => {}
                            Err(e) => {
                                eprintln!("cuquota-dra-plugin: device health: {e}");
                                std::thread::sleep(period);
                            }
                        },
                        None => std::thread::sleep(period),
                    }
                    if nvml.is_none() {
                        break; // load it again
                    }
                }
            }
        })?;
    Ok(Monitor {
        health: rx,
        unhealthy: why_rx,
    })
}

/// The kubelet's health service: the latest list at once, then each new one.
#[derive(Debug)]
pub struct HealthService(pub watch::Receiver<Vec<DeviceHealth>>);

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = ReceiverStream<Result<NodeWatchResourcesResponse, Status>>;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let mut rx = self.0.clone();
        let (tx, out) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let devices = rx.borrow_and_update().clone();
                if tx.send(Ok(NodeWatchResourcesResponse { devices })).await.is_err() {
                    return; // the kubelet went away
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }
}
