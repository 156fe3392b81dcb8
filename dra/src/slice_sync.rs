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
//!
//! Unhealthy GPUs (`device_health`) carry a taint, key [`UNHEALTHY_TAINT`], value why (`gpu-lost`, `xid-79`),
//! effect NoSchedule, `timeAdded` when the plugin first saw it: the scheduler allocates a tainted device to no
//! claim that does not tolerate it. They are tainted whether or not the kubelet opened its health stream,
//! as NVIDIA's DRA driver taints them (`gpu.nvidia.com/xid`): that stream only reaches the pod's status, and
//! the taint is what keeps new claims off the GPU. A server without `DRADeviceTaints` (off by default before
//! 1.36, KEP 5055) drops the taints: that is logged, not fatal, since the GPUs are still shared correctly and
//! the kubelet's health stream still reports them.

use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};

use crate::inventory::Inventory;
use crate::kube_api::{slice_object, FIELD_MANAGER};

/// The key of an unhealthy GPU's taint.
pub const UNHEALTHY_TAINT: &str = "gpu.cuquota.io/unhealthy";

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
    /// Unhealthy devices by name: why, and since when.
    unhealthy: BTreeMap<String, (String, Time)>,
    /// The unhealthy devices (and why) of the last apply the server stored.
    applied: BTreeMap<String, String>,
}

impl std::fmt::Debug for SliceSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceSync") // kube's Client has no Debug
            .field("driver", &self.driver)
            .field("node_uid", &self.node_uid)
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
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
            unhealthy: BTreeMap::new(),
            applied: BTreeMap::new(),
        }
    }

    /// The devices now unhealthy, by name, with why; the next sync taints them (and no others).
    pub fn set_unhealthy(&mut self, devices: &[(String, String)]) {
        let mut now = BTreeMap::new();
        for (name, why) in devices {
            let since = match self.unhealthy.remove(name) {
                Some((w, t)) if w == *why => t,
                _ => Time(k8s_openapi::jiff::Timestamp::now()),
            };
            now.insert(name.clone(), (why.clone(), since));
        }
        self.unhealthy = now;
    }

    fn wanted_taints(&self) -> BTreeMap<String, String> {
        self.unhealthy
            .iter()
            .map(|(d, (w, _))| (d.clone(), w.clone()))
            .collect()
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
            Some(s)
                if self.stored.as_ref() == Some(&s.spec)
                    && owned(s)
                    && self.applied == self.wanted_taints() =>
            {
                return Ok(Synced::Unchanged)
            }
            Some(s) => (
                s.spec.pool.generation.max(1),
                Synced::Updated as fn(i64) -> Synced,
            ),
        };
        let mut want = slice_object(&self.driver, &self.inventory, generation)
            .map_err(|e| SyncError::Api(e.to_string()))?;
        for d in want.spec.devices.iter_mut().flatten() {
            if let Some((why, since)) = self.unhealthy.get(&d.name) {
                d.taints = Some(vec![DeviceTaint {
                    key: UNHEALTHY_TAINT.into(),
                    value: Some(why.clone()),
                    effect: "NoSchedule".into(),
                    time_added: Some(since.clone()),
                }]);
            }
        }
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
        let dropped: Vec<&str> = want
            .spec
            .devices
            .iter()
            .flatten()
            .filter(|d| d.taints.is_some())
            .filter(|d| {
                let kept = stored.spec.devices.iter().flatten().find(|s| s.name == d.name);
                kept.and_then(|s| s.taints.as_ref()).is_none_or(|t| t.is_empty())
            })
            .map(|d| d.name.as_str())
            .collect();
        if !dropped.is_empty() {
            // Not fatal: the GPUs stay shared correctly; only the unhealthy ones stay schedulable.
            eprintln!(
                "cuquota-dra-plugin: ResourceSlice {name}: the API server dropped the taints of unhealthy \
                 device(s) {dropped:?}: the DRADeviceTaints feature is off on this cluster, so the scheduler may \
                 still place claims on them (the kubelet's health stream reports them in pod status, where \
                 the kubelet has it); turn it on (kube-apiserver, kube-scheduler: \
                 --feature-gates=DRADeviceTaints=true) to keep claims off unhealthy GPUs"
            );
        }
        self.applied = self.wanted_taints();
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
