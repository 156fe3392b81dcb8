//! What a ResourceClaim (`resource.k8s.io/v1`) grants this driver: the part of the object the plugin reads
//! (its allocation's device results with their `consumedCapacity`, the opaque configuration for this driver,
//! the pods it is reserved for), and the check that turns it into [`Grant`]s the node can honour.

use std::collections::BTreeMap;

use cuquota_core::policy::DEFAULT_WEIGHT;
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
    /// `FromClass` or `FromClaim`: the class's entries bound the claim's.
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
            let class = Settings::parse("FromClass", &merged(alloc, driver, &r.request, "FromClass")?)?;
            let claim = Settings::parse("FromClaim", &merged(alloc, driver, &r.request, "FromClaim")?)?;
            let cfg = class.bound(&claim)?;
            devices.push(Grant {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                uuid: gpu.uuid.clone(),
                memory,
                sm,
                policy: cfg.policy.unwrap_or_default().as_str().into(),
                priority: cfg.priority.map(|p| p.as_str().into()),
                reserved_memory: cfg.reserved_memory,
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

/// One source's configuration for `request` (`FromClass` or `FromClaim`): its entries in order, later fields
/// winning.
fn merged(alloc: &Allocation, driver: &str, request: &str, source: &str) -> Result<GpuConfig, String> {
    let parent = request.split('/').next().unwrap_or(request);
    let mut out = GpuConfig::default();
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
    Ok(out)
}

/// One source's configuration, checked; `None` = not set there.
#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    policy: Option<PolicyKind>,
    priority: Option<Priority>,
    reserved_memory: Option<u64>,
    weight: Option<u32>,
}

impl Settings {
    fn parse(source: &str, cfg: &GpuConfig) -> Result<Settings, String> {
        let policy = match cfg.policy.as_deref() {
            None => None,
            Some(p) => match PolicyKind::parse(p) {
                Some(PolicyKind::Disabled) | None => {
                    return Err(format!("{source}: policy {p:?}: expected hard, burst or default"))
                }
                k => k,
            },
        };
        let priority = match cfg.priority.as_deref() {
            None => None,
            Some(p) => Some(
                Priority::parse(p)
                    .ok_or_else(|| format!("{source}: priority {p:?}: expected high or low"))?,
            ),
        };
        let reserved_memory = match cfg.reserved_memory.as_deref() {
            None => None,
            Some(q) => Some(
                quantity::parse(q)
                    .ok_or_else(|| format!("{source}: reservedMemory {q:?} is not a quantity"))?,
            ),
        };
        if let Some(w) = cfg.weight.filter(|w| !(1..=1000).contains(w)) {
            return Err(format!("{source}: weight {w}: expected 1-1000"));
        }
        Ok(Settings {
            policy,
            priority,
            reserved_memory,
            weight: cfg.weight,
        })
    }

    /// The class's settings (`self`) with the claim's where the claim asks for no more: a lower priority, a
    /// stricter policy, a smaller weight, a larger reservation. A claim asking for more is refused, naming the
    /// parameter (docs/kubernetes.md, "The class bounds the claim"): the class is the operator's, the claim the
    /// pod author's.
    fn bound(&self, claim: &Settings) -> Result<Settings, String> {
        let refuse = |what: &str, asked: String, class: String| {
            Err(format!(
                "the claim's {what} {asked} goes beyond its DeviceClass's {class}: a claim may only ask for less \
                 than its class (lower priority, stricter policy, smaller weight, more reservedMemory)"
            ))
        };
        // Low yields to high tenants; none is not gated at all; high is gated by no one.
        let rank = |p: Option<Priority>| match p {
            Some(Priority::Low) => 0,
            None => 1,
            Some(Priority::High) => 2,
        };
        let name = |p: Option<Priority>| p.map_or("none (no priority)", Priority::as_str);
        if let Some(p) = claim.priority {
            if rank(Some(p)) > rank(self.priority) {
                return refuse(
                    "priority",
                    format!("{:?}", p.as_str()),
                    name(self.priority).into(),
                );
            }
        }
        // Burst and default both work-conserving: only leaving `hard` loosens.
        if let Some(k) = claim.policy {
            if self.policy == Some(PolicyKind::Hard) && k != PolicyKind::Hard {
                return refuse("policy", format!("{:?}", k.as_str()), "hard".into());
            }
        }
        let weight = self.weight.unwrap_or(DEFAULT_WEIGHT);
        if let Some(w) = claim.weight.filter(|&w| w > weight) {
            return refuse("weight", w.to_string(), weight.to_string());
        }
        let reserve = self.reserved_memory.unwrap_or(0);
        if let Some(r) = claim.reserved_memory.filter(|&r| r < reserve) {
            return refuse("reservedMemory", format!("{r} bytes"), format!("{reserve} bytes"));
        }
        Ok(Settings {
            policy: match (self.policy, claim.policy) {
                (Some(a), Some(b)) => Some(PolicyKind::stricter(a, b)),
                (a, b) => b.or(a),
            },
            priority: claim.priority.or(self.priority),
            reserved_memory: claim.reserved_memory.or(self.reserved_memory),
            weight: claim.weight.or(self.weight),
        })
    }
}
