//! The SM-share capacity under HAMi's DRA name too, so that claims written for HAMi's driver carry over:
//! HAMi's k8s-dra-driver names its capacities `memory` and `cores`, ours `memory` and `sm` (both percent of the
//! GPU's SM time). A node publishes one of the two names in its ResourceSlice (`--sm-capacity-name`), never
//! both: the scheduler sums each capacity apart, and two names for one budget would let the GPU's SM time be
//! granted twice. A claim's `consumedCapacity` is read under either name.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::claim::CAPACITY_SM;

/// HAMi's name of the SM-share capacity.
pub const CAPACITY_CORES: &str = "cores";

static PUBLISHED: OnceLock<&'static str> = OnceLock::new();

/// A name of the SM-share capacity that cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmNameError {
    /// Neither `sm` nor `cores`.
    #[error("{0:?}: expected {CAPACITY_SM} or {CAPACITY_CORES}")]
    Unknown(String),
    /// Already published under the other name.
    #[error("the SM capacity is already published as {0:?}")]
    AlreadyPublished(&'static str),
}

/// Sets the name the node's ResourceSlice gives the SM share (`sm` or `cores`), once, before it is published.
pub fn publish_sm_as(name: &str) -> Result<(), SmNameError> {
    let name = match name {
        CAPACITY_SM => CAPACITY_SM,
        CAPACITY_CORES => CAPACITY_CORES,
        other => return Err(SmNameError::Unknown(other.to_string())),
    };
    match PUBLISHED.get_or_init(|| name) {
        n if *n == name => Ok(()),
        n => Err(SmNameError::AlreadyPublished(n)),
    }
}

/// The name the node's ResourceSlice gives the SM share: `sm` unless [`publish_sm_as`] said `cores`.
pub fn sm_published() -> &'static str {
    PUBLISHED.get().copied().unwrap_or(CAPACITY_SM)
}

/// A device result that names the SM share twice, differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("consumedCapacity names the SM share twice, {CAPACITY_SM} {sm:?} and {CAPACITY_CORES} {cores:?}")]
pub struct SmNamesError {
    /// Under `sm`.
    pub sm: String,
    /// Under `cores`.
    pub cores: String,
}

/// The SM share a device result consumes, under `sm` or HAMi's `cores`; both present must agree.
pub fn consumed_sm(consumed: &BTreeMap<String, String>) -> Result<Option<&String>, SmNamesError> {
    match (consumed.get(CAPACITY_SM), consumed.get(CAPACITY_CORES)) {
        (Some(a), Some(b)) if a != b => Err(SmNamesError {
            sm: a.clone(),
            cores: b.clone(),
        }),
        (a, b) => Ok(a.or(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Gpu, Inventory};

    const GPU: &str = "GPU-0badc0de-1111-2222-3333-444455556666";

    fn grant_sm(capacity: serde_json::Value) -> Result<Option<u32>, crate::claim::ClaimError> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/claim.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = capacity;
        let claim: crate::claim::ResourceClaim = serde_json::from_value(v).unwrap();
        let inv = Inventory {
            pool: "node-1".into(),
            gpus: vec![Gpu::new(GPU, 80 << 30, "NVIDIA H100 80GB HBM3").unwrap()],
        };
        claim.grants(crate::DRIVER_NAME, &inv).map(|g| g.devices[0].sm)
    }

    #[test]
    fn a_hami_claims_cores_is_its_sm_share() {
        use serde_json::json;
        // The control: our own name.
        assert_eq!(grant_sm(json!({"memory": "4Gi", "sm": "30"})), Ok(Some(30)));
        // HAMi's name: the same share, not the whole GPU.
        assert_eq!(grant_sm(json!({"memory": "4Gi", "cores": "30"})), Ok(Some(30)));
        assert_eq!(
            grant_sm(json!({"memory": "4Gi", "cores": "30", "sm": "30"})),
            Ok(Some(30))
        );
        let e = grant_sm(json!({"memory": "4Gi", "cores": "30", "sm": "60"})).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = grant_sm(json!({"memory": "4Gi", "cores": "300"})).unwrap_err();
        assert!(e.to_string().contains("1-100"), "{e}");
    }

    #[test]
    fn the_published_name_is_one_of_the_two() {
        assert!(publish_sm_as("gpu-cores").is_err());
    }
}
