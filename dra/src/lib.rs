//! cuquota's Kubernetes DRA node plugin (docs/kubernetes.md): registers with the kubelet, and for each
//! allocated ResourceClaim writes the limits file, usage file, agent descriptor and CDI spec that enforce what
//! the scheduler granted (`consumedCapacity` of the `memory` and `sm` capacities).
//!
//! `claim` reads a ResourceClaim, `prepare` writes and removes a claim's files, `server` serves the kubelet's
//! gRPC APIs (generated from `proto/` in `proto`), `source` finds the claims.

pub mod capacity_names;
pub mod claim;
pub mod device_health;
pub mod gpu_access;
pub mod health;
pub mod inventory;
pub mod kube_api;
pub mod pack;
pub mod prepare;
pub mod quantity;
pub mod server;
pub mod slice;
pub mod slice_sync;
pub mod source;

/// The kubelet's gRPC APIs, generated from `dra/proto/` by `build.rs`.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod proto {
    /// `k8s.io.kubelet.pkg.apis.dra.v1`: NodePrepareResources / NodeUnprepareResources.
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `v1alpha1` (dra-health): NodeWatchResources, the devices' health streamed to the kubelet.
    pub mod health {
        tonic::include_proto!("v1alpha1");
    }
    /// `pluginregistration` (v1): GetInfo / NotifyRegistrationStatus.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

/// The default driver name (the DeviceClass selects `device.driver == "gpu.cuquota.io"`).
pub const DRIVER_NAME: &str = "gpu.cuquota.io";
