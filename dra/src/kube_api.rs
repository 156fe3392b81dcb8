//! The driver's Kubernetes API calls, through kube-rs and k8s-openapi's `resource.k8s.io/v1` types: read the
//! ResourceClaim the kubelet names; the node's ResourceSlice as the API's type (`slice_sync` publishes it with
//! server-side apply, so a restart or an upgrade replaces the plugin's own fields and nothing else).

use k8s_openapi::api::resource::v1::{ResourceClaim as ApiClaim, ResourceSlice};
use kube::{Api, Client};

use crate::claim::ResourceClaim;
use crate::inventory::Inventory;
use crate::source::{BoxFuture, ClaimSource, SourceError};

/// The field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "cuquota-dra-plugin";

/// Claims read from the API server.
pub struct KubeSource(pub Client);

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeSource") // kube's Client has no Debug
    }
}

impl ClaimSource for KubeSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, SourceError>> {
        Box::pin(async move {
            let api: Api<ApiClaim> = Api::namespaced(self.0.clone(), namespace);
            let c = api.get(name).await.map_err(|e| SourceError::Get {
                what: format!("{namespace}/{name}"),
                source: Box::new(e),
            })?;
            let v = serde_json::to_value(&c)?;
            serde_json::from_value(v).map_err(|source| SourceError::Decode {
                what: format!("{namespace}/{name}"),
                source,
            })
        })
    }

    fn exists<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let api: Api<ApiClaim> = Api::namespaced(self.0.clone(), namespace);
            let c = api.get_opt(name).await.map_err(|e| SourceError::Get {
                what: format!("{namespace}/{name}"),
                source: Box::new(e),
            })?;
            Ok(c.is_some_and(|c| c.metadata.uid.as_deref() == Some(uid)))
        })
    }
}

/// The generated ResourceSlice is not one of the API's type (a bug of the plugin, or an API it does not know).
#[derive(Debug, thiserror::Error)]
#[error("the generated ResourceSlice does not fit the API's type: {0}")]
pub struct SliceTypeError(#[source] serde_json::Error);

/// The node's ResourceSlice as the API's type (the generated object must be one).
pub fn slice_object(driver: &str, inv: &Inventory, generation: i64) -> Result<ResourceSlice, SliceTypeError> {
    serde_json::from_value(crate::slice::resource_slice(driver, inv, generation)).map_err(SliceTypeError)
}
