//! What a ResourceClaim (`resource.k8s.io/v1`) grants this driver: the part of the object the plugin reads
//! (its allocation's device results with their `consumedCapacity`, the opaque configuration for this driver,
//! the pods it is reserved for), and the check that turns it into [`Grant`]s the node can honour.

use std::collections::BTreeMap;

use cuquota_core::{PolicyKind, Priority};
use serde::{Deserialize, Serialize};

use crate::inventory::Inventory;
use crate::quantity;

/// The capacity name of device memory (bytes) in the ResourceSlice and in `consumedCapacity`.
pub const CAPACITY_MEMORY: &str = "memory";
/// The capacity name of the SM-time share (percent).
pub const CAPACITY_SM: &str = "sm";
/// `apiVersion` of this driver's opaque claim configuration.
pub const CONFIG_API_VERSION: &str = "gpu.cuquota.io/v1alpha1";
/// `kind` of this driver's opaque claim configuration.
pub const CONFIG_KIND: &str = "GpuConfig";

/// A ResourceClaim as the API server returns it (only the fields the plugin reads; others are ignored).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    /// `metadata`.
    pub metadata: Metadata,
    /// `status`.
    #[serde(default)]
    pub status: ClaimStatus,
}

/// `metadata` (name, namespace, uid).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Metadata {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
}

/// `status`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// `status.allocation`; absent until the scheduler allocated the claim.
    #[serde(default)]
    pub allocation: Option<Allocation>,
    /// `status.reservedFor`: the consumers (pods) the claim is reserved for.
    #[serde(default)]
    pub reserved_for: Vec<ConsumerRef>,
}

/// `status.allocation`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Allocation {
    /// `devices`.
    #[serde(default)]
    pub devices: DeviceAllocation,
}

/// `status.allocation.devices`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct DeviceAllocation {
    /// One per allocated device.
    #[serde(default)]
    pub results: Vec<DeviceResult>,
    /// Configuration from the class and the claim.
    #[serde(default)]
    pub config: Vec<AllocatedConfig>,
}

/// One allocated device.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceResult {
    /// The request of the claim it satisfies (`req` or `req/subrequest`).
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The pool (this driver: the node name).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// What the claim consumes of the device's capacities (quantities), when the device allows several
    /// allocations.
    #[serde(default)]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// One configuration entry of the allocation.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct AllocatedConfig {
    /// `FromClass` or `FromClaim`: a claim's entry overrides its class's.
    #[serde(default)]
    pub source: String,
    /// The requests it applies to; empty = all.
    #[serde(default)]
    pub requests: Vec<String>,
    /// Driver-specific parameters.
    #[serde(default)]
    pub opaque: Option<OpaqueConfig>,
}

/// `opaque`: parameters for one driver.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct OpaqueConfig {
    /// The driver they are for (others' entries are ignored).
    pub driver: String,
    /// The parameters (for this driver: a [`GpuConfig`]).
    pub parameters: serde_json::Value,
}

/// A consumer of the claim.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct ConsumerRef {
    /// `pods` for a pod.
    #[serde(default)]
    pub resource: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its UID.
    #[serde(default)]
    pub uid: String,
}

/// This driver's claim configuration (`opaque.parameters`):
/// `{"apiVersion": "gpu.cuquota.io/v1alpha1", "kind": "GpuConfig", "policy": "hard", "priority": "high",
/// "reservedMemory": "2Gi", "weight": 100}`; every field but the two type fields is optional.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// Must be [`CONFIG_API_VERSION`].
    pub api_version: String,
    /// Must be [`CONFIG_KIND`].
    pub kind: String,
    /// SM policy: `hard`, `burst`, `default` (`disabled` is refused: a claim's SM share is enforced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// `high` or `low` (docs/priority.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// Device memory this tenant leaves free for high-priority tenants (a quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_memory: Option<String>,
    /// Share of spare time in burst mode, 1-1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// What the node must enforce for one allocated device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The request it satisfies.
    pub request: String,
    /// Pool and device name, as allocated.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// Memory cap in bytes.
    pub memory: u64,
    /// SM-time share in percent; `None` = the whole device.
    pub sm: Option<u32>,
    /// SM policy (`hard`, `burst`, `default`).
    pub policy: String,
    /// `high`, `low` or none.
    pub priority: Option<String>,
    /// Reserved memory in bytes, if any.
    pub reserved_memory: Option<u64>,
    /// Burst weight, if any.
    pub weight: Option<u32>,
}

/// The claim, checked: its grants on this node and the pods it is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    /// One per device of this driver, in the allocation's order.
    pub devices: Vec<Grant>,
    /// Reserved-for pods: (name, uid).
    pub pods: Vec<(String, String)>,
}

impl ResourceClaim {
    /// The grants of this driver's devices. Errors (a claim the node cannot honour) name what is wrong.
    pub fn grants(&self, driver: &str, inventory: &Inventory) -> Result<Grants, String> {
        let alloc = self
            .status
            .allocation
            .as_ref()
            .ok_or("the claim is not allocated (no status.allocation)")?;
        let mut devices = Vec::new();
        for r in alloc.devices.results.iter().filter(|r| r.driver == driver) {
            let gpu = inventory.by_name(&r.device).ok_or_else(|| {
                format!(
                    "device {:?} of pool {:?} is not a GPU of this node (known: {})",
                    r.device,
                    r.pool,
                    inventory.names().join(", ")
                )
            })?;
            if r.pool != inventory.pool {
                return Err(format!(
                    "device {:?} is in pool {:?}, this node's pool is {:?}",
                    r.device, r.pool, inventory.pool
                ));
            }
            let memory = match r.consumed_capacity.get(CAPACITY_MEMORY) {
                Some(q) => quantity::parse(q)
                    .ok_or_else(|| format!("consumedCapacity memory {q:?} is not a quantity"))?,
                None => gpu.memory,
            };
            if memory == 0 || memory > gpu.memory {
                return Err(format!(
                    "consumedCapacity memory {} is not within the device's 1..={} bytes",
                    memory, gpu.memory
                ));
            }
            let sm = match r.consumed_capacity.get(CAPACITY_SM) {
                Some(q) => {
                    let v = quantity::parse(q)
                        .ok_or_else(|| format!("consumedCapacity sm {q:?} is not a quantity"))?;
                    if !(1..=100).contains(&v) {
                        return Err(format!("consumedCapacity sm {v} is not a percentage 1-100"));
                    }
                    (v < 100).then_some(v as u32)
                }
                None => None,
            };
            let cfg = config_for(alloc, driver, &r.request)?;
            let policy = cfg.policy.clone().unwrap_or_else(|| "default".into());
            match PolicyKind::parse(&policy) {
                Some(PolicyKind::Disabled) | None => {
                    return Err(format!("policy {policy:?}: expected hard, burst or default"))
                }
                Some(_) => {}
            }
            if let Some(p) = &cfg.priority {
                Priority::parse(p).ok_or_else(|| format!("priority {p:?}: expected high or low"))?;
            }
            let reserved_memory = match &cfg.reserved_memory {
                Some(q) => Some(
                    quantity::parse(q).ok_or_else(|| format!("reservedMemory {q:?} is not a quantity"))?,
                ),
                None => None,
            };
            if let Some(w) = cfg.weight {
                if !(1..=1000).contains(&w) {
                    return Err(format!("weight {w}: expected 1-1000"));
                }
            }
            devices.push(Grant {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                uuid: gpu.uuid.clone(),
                memory,
                sm,
                policy,
                priority: cfg.priority.clone(),
                reserved_memory,
                weight: cfg.weight,
            });
        }
        if devices.is_empty() {
            return Err(format!("the allocation has no device of driver {driver}"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &devices {
            if !seen.insert(&g.uuid) {
                return Err(format!("GPU {} is allocated twice to the claim", g.uuid));
            }
        }
        let pods = self
            .status
            .reserved_for
            .iter()
            .filter(|c| c.resource == "pods" && !c.uid.is_empty())
            .map(|c| (c.name.clone(), c.uid.clone()))
            .collect();
        Ok(Grants { devices, pods })
    }
}

/// This driver's configuration for `request`: the class's entries, then the claim's, later fields winning.
fn config_for(alloc: &Allocation, driver: &str, request: &str) -> Result<GpuConfig, String> {
    let parent = request.split('/').next().unwrap_or(request);
    let mut out = GpuConfig::default();
    for source in ["FromClass", "FromClaim"] {
        for c in alloc.devices.config.iter().filter(|c| c.source == source) {
            let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
                continue;
            };
            if !c.requests.is_empty() && !c.requests.iter().any(|r| r == request || r == parent) {
                continue;
            }
            let g: GpuConfig = serde_json::from_value(o.parameters.clone())
                .map_err(|e| format!("{source} configuration for {driver}: {e}"))?;
            if g.api_version != CONFIG_API_VERSION || g.kind != CONFIG_KIND {
                return Err(format!(
                    "{source} configuration: expected apiVersion {CONFIG_API_VERSION} kind {CONFIG_KIND}, got {} {}",
                    g.api_version, g.kind
                ));
            }
            out.policy = g.policy.or(out.policy);
            out.priority = g.priority.or(out.priority);
            out.reserved_memory = g.reserved_memory.or(out.reserved_memory);
            out.weight = g.weight.or(out.weight);
        }
    }
    Ok(out)
}
