//! Where the plugin reads a ResourceClaim the kubelet names: the API server, or a directory of objects.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use crate::claim::ResourceClaim;

/// A future the sources return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Reads ResourceClaims.
pub trait ClaimSource: std::fmt::Debug + Send + Sync + 'static {
    /// The claim `namespace/name`; an error names what failed.
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<ResourceClaim, String>>;

    /// Whether the claim `namespace/name` with UID `uid` still exists: `Ok(false)` only when the source says
    /// it is gone (deleted, or re-created with another UID), so that its preparation may be removed; a source
    /// that cannot be read is an error.
    fn exists<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// Claims as JSON files `DIR/<namespace>/<name>.json` (what `kubectl get resourceclaim -o json` prints): for
/// tests and for a node without an API server.
#[derive(Debug)]
pub struct DirSource(pub PathBuf);

impl ClaimSource for DirSource {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            let path = self.0.join(namespace).join(format!("{name}.json"));
            let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
        })
    }

    fn exists<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            // The directory itself missing: the source is unreachable, not the claim gone.
            if !self.0.is_dir() {
                return Err(format!("{}: not a directory", self.0.display()));
            }
            let path = self.0.join(namespace).join(format!("{name}.json"));
            if !path.exists() {
                return Ok(false);
            }
            Ok(self.get(namespace, name).await?.metadata.uid == uid)
        })
    }
}
