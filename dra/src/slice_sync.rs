//! Keeping the node's ResourceSlice published, with the semantics of upstream's controller
//! (k8s.io/dynamic-resource-allocation/resourceslice): the kubelet deletes every slice of its node when it
//! starts, and anyone may change or delete a slice, so the plugin compares what the server holds with what it
//! last stored, on every resync, and applies again when it is gone or changed. A slice created anew starts at
//! generation one above the highest the pool has (none: 1); an update of the one slice keeps its generation
//! (upstream bumps only when more than one call is needed). The slice is owned by its Node (controller
//! reference), so the garbage collector removes it with the node.
//!
//! Fields the server drops: on a cluster where consumable capacity is off (`DRAConsumableCapacity`, off by
//! default before 1.36) the server stores the devices without `allowMultipleAllocations` and the capacities'
//! `requestPolicy`, and every GPU would be allocated whole to one claim, silently. Upstream detects this the
//! same way (its `DroppedFieldsError`); this plugin then deletes the slice it just stored and says why: it
//! does not publish exclusive GPUs in place of shared ones.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};

use crate::inventory::Inventory;
use crate::kube_api::{slice_object, FIELD_MANAGER};

/// Why a sync did not leave the slice published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncError {
    /// An API call failed (retried at the next resync).
    Api(String),
    /// The server dropped fields the driver needs; the slice was deleted again.
    DroppedFields(String),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api(e) | SyncError::DroppedFields(e) => f.write_str(e),
        }
    }
}

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// The slice was missing and was created, at this generation.
    Created(i64),
    /// The slice differed from what was stored last and was applied again, at this generation.
    Updated(i64),
    /// The server holds what the plugin stored last.
    Unchanged,
}

/// The node's slice and what the plugin last stored of it.
pub struct SliceSync {
    client: Client,
    driver: String,
    inventory: Inventory,
    node_uid: Option<String>,
    stored: Option<ResourceSliceSpec>,
}

impl SliceSync {
    /// A sync of `inventory`'s slice (its pool is the node's name).
    pub fn new(client: Client, driver: &str, inventory: Inventory) -> SliceSync {
        SliceSync {
            client,
            driver: driver.to_string(),
            inventory,
            node_uid: None,
            stored: None,
        }
    }

    /// The slice's name.
    pub fn name(&self) -> String {
        format!("{}-{}", self.inventory.pool, self.driver)
    }

    /// One resync: reads the slice, and applies it when it is missing or not what was stored last.
    pub async fn sync(&mut self) -> Result<Synced, SyncError> {
        let node = self.inventory.pool.clone();
        let api_err = |what: String| move |e: kube::Error| SyncError::Api(format!("{what}: {e}"));
        let uid = match &self.node_uid {
            Some(u) => u.clone(),
            None => {
                let nodes: Api<Node> = Api::all(self.client.clone());
                let n = nodes
                    .get(&node)
                    .await
                    .map_err(api_err(format!("GET node {node}")))?;
                let uid = n
                    .metadata
                    .uid
                    .ok_or_else(|| SyncError::Api(format!("node {node} has no UID")))?;
                self.node_uid = Some(uid.clone());
                uid
            }
        };
        let name = self.name();
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let current = api
            .get_opt(&name)
            .await
            .map_err(api_err(format!("GET ResourceSlice {name}")))?;
        let owned = |s: &ResourceSlice| {
            s.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Node" && o.uid == uid && o.controller == Some(true))
        };
        let (generation, made) = match &current {
            None => (1, Synced::Created as fn(i64) -> Synced),
            Some(s) if self.stored.as_ref() == Some(&s.spec) && owned(s) => return Ok(Synced::Unchanged),
            Some(s) => (
                s.spec.pool.generation.max(1),
                Synced::Updated as fn(i64) -> Synced,
            ),
        };
        let mut want = slice_object(&self.driver, &self.inventory, generation).map_err(SyncError::Api)?;
        want.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let stored = api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&want),
            )
            .await
            .map_err(api_err(format!("apply ResourceSlice {name}")))?;
        if let Some(dropped) = dropped_fields(&want.spec, &stored.spec) {
            self.stored = None;
            let dp = DeleteParams {
                preconditions: stored.metadata.uid.clone().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let deleted = match api.delete(&name, &dp).await {
                Ok(_) => "deleted it again".to_string(),
                Err(e) => format!("and could not delete it ({e}): delete it by hand"),
            };
            return Err(SyncError::DroppedFields(format!(
                "the API server dropped {dropped} from ResourceSlice {name}: the DRAConsumableCapacity feature \
                 is off on this cluster, and its GPUs would be allocated whole to one claim each; the plugin \
                 {deleted} and publishes no GPU until the feature gate is on (kube-apiserver, kube-scheduler, \
                 kubelet: --feature-gates=DRAConsumableCapacity=true)"
            )));
        }
        self.stored = Some(stored.spec);
        Ok(made(generation))
    }
}

/// The fields of `want` (as applied) the server did not store, named; `None` when it stored them all.
pub fn dropped_fields(want: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Option<String> {
    let want = want.devices.iter().flatten();
    let stored: Vec<_> = stored.devices.iter().flatten().collect();
    for (i, d) in want.enumerate() {
        let Some(s) = stored.get(i) else {
            return Some(format!("device {:?}", d.name));
        };
        if d.allow_multiple_allocations.is_some() && s.allow_multiple_allocations.is_none() {
            return Some(format!("device {:?}'s allowMultipleAllocations", d.name));
        }
        for (c, cap) in d.capacity.iter().flatten() {
            let kept = s.capacity.as_ref().and_then(|m| m.get(c));
            if cap.request_policy.is_some() && kept.and_then(|k| k.request_policy.as_ref()).is_none() {
                return Some(format!("device {:?}'s capacity {c:?} requestPolicy", d.name));
            }
        }
    }
    None
}
