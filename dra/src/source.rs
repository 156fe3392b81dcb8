//! Where the plugin reads a ResourceClaim the kubelet names: the API server, or a directory of objects.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use crate::claim::ResourceClaim;

/// A future the sources return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A claim file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A claim file or object is not a ResourceClaim as this plugin reads it.
    #[error("{what}: {source}")]
    Decode {
        /// The file, or `namespace/name`.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The claims directory is missing: the source is unreachable, not the claim gone.
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// The API server did not answer the GET.
    #[error("GET {what}: {source}")]
    Get {
        /// `namespace/name`.
        what: String,
        /// Why.
        source: Box<kube::Error>,
    },
    /// The API's object did not serialise.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Reads ResourceClaims.
pub trait ClaimSource: std::fmt::Debug + Send + Sync + 'static {
    /// The claim `namespace/name`; an error names what failed.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, SourceError>>;

    /// Whether the claim `namespace/name` with UID `uid` still exists: `Ok(false)` only when the source says
    /// it is gone (deleted, or re-created with another UID), so that its preparation may be removed; a source
    /// that cannot be read is an error.
    fn exists<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, SourceError>>;
}

/// Claims as JSON files `DIR/<namespace>/<name>.json` (what `kubectl get resourceclaim -o json` prints): for
/// tests and for a node without an API server.
#[derive(Debug)]
pub struct DirSource(pub PathBuf);

impl ClaimSource for DirSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, SourceError>> {
        Box::pin(async move {
            let path = self.0.join(namespace).join(format!("{name}.json"));
            let text = std::fs::read(&path).map_err(|source| SourceError::Read {
                path: path.clone(),
                source,
            })?;
            serde_json::from_slice(&text).map_err(|source| SourceError::Decode {
                what: path.display().to_string(),
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
            // The directory itself missing: the source is unreachable, not the claim gone.
            if !self.0.is_dir() {
                return Err(SourceError::NotADirectory(self.0.clone()));
            }
            let path = self.0.join(namespace).join(format!("{name}.json"));
            if !path.exists() {
                return Ok(false);
            }
            Ok(self.get(namespace, name).await?.metadata.uid == uid)
        })
    }
}
