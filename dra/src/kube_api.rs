//! The driver's Kubernetes API calls, through kube-rs and k8s-openapi's `resource.k8s.io/v1` types: read the
//! ResourceClaim the kubelet names, and publish the node's ResourceSlice (server-side apply, so a restart or
//! an upgrade replaces the plugin's own fields and nothing else).

use k8s_openapi::api::resource::v1::{ResourceClaim as ApiClaim, ResourceSlice};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::claim::ResourceClaim;
use crate::inventory::Inventory;
use crate::source::{BoxFuture, ClaimSource};

/// The field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "cuquota-dra-plugin";

/// Claims read from the API server.
pub struct KubeSource(pub Client);

impl ClaimSource for KubeSource {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            let api: Api<ApiClaim> = Api::namespaced(self.0.clone(), namespace);
            let c = api
                .get(name)
                .await
                .map_err(|e| format!("GET {namespace}/{name}: {e}"))?;
            let v = serde_json::to_value(&c).map_err(|e| e.to_string())?;
            serde_json::from_value(v).map_err(|e| format!("{namespace}/{name}: {e}"))
        })
    }
}

/// The node's ResourceSlice as the API's type (the generated object must be one).
pub fn slice_object(driver: &str, inv: &Inventory, generation: i64) -> Result<ResourceSlice, String> {
    serde_json::from_value(crate::slice::resource_slice(driver, inv, generation))
        .map_err(|e| format!("the generated ResourceSlice does not fit the API's type: {e}"))
}

/// Publishes (creates or updates) the node's ResourceSlice; returns what the server stored.
pub async fn publish_slice(client: &Client, driver: &str, inv: &Inventory) -> Result<ResourceSlice, String> {
    let slice = slice_object(driver, inv, 1)?;
    let name = slice.metadata.name.clone().unwrap_or_default();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&slice),
    )
    .await
    .map_err(|e| format!("apply ResourceSlice {name}: {e}"))
}
