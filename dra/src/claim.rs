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
    /// The share of a device that allows several allocations (`shareID`): one device may serve a claim under
    /// several share IDs.
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
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
/// "reservedMemory": "2Gi", "weight": 100, "memoryLimit": "16Gi"}`; every field but the two type fields is
/// optional.
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
    /// The memory the container is shown (a quantity), above the granted `consumedCapacity` memory, which is
    /// its request (guaranteed: the scheduler keeps the grants' sum within the GPU). Unset = the grant (not
    /// elastic). A claim may set it only up to its class's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
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
    /// The allocation's share ID of the device, if any (checkpoints before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// Memory granted in bytes (`consumedCapacity`): the request, and the cap unless `memory_limit` is set.
    pub memory: u64,
    /// The cap when above the grant (`memoryLimit`): the tenant is elastic. Absent in checkpoints before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
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

/// Why a claim cannot be honoured on this node (the kubelet shows it on the pod): each names the field and
/// what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// No `status.allocation`.
    #[error("the claim is not allocated (no status.allocation)")]
    NotAllocated,
    /// A device this node does not have.
    #[error("device {device:?} of pool {pool:?} is not a GPU of this node (known: {known})")]
    UnknownDevice {
        /// The result's device.
        device: String,
        /// The result's pool.
        pool: String,
        /// This node's devices, joined.
        known: String,
    },
    /// A device of another node's pool.
    #[error("device {device:?} is in pool {pool:?}, this node's pool is {node_pool:?}")]
    OtherPool {
        /// The result's device.
        device: String,
        /// The result's pool.
        pool: String,
        /// This node's pool.
        node_pool: String,
    },
    /// `consumedCapacity.memory` is no quantity.
    #[error("consumedCapacity memory {0:?} is not a quantity")]
    MemoryQuantity(String),
    /// `consumedCapacity.memory` is 0 or more than the device has.
    #[error("consumedCapacity memory {memory} is not within the device's 1..={device} bytes")]
    MemoryRange {
        /// Asked.
        memory: u64,
        /// The device's memory.
        device: u64,
    },
    /// The SM share named twice, differently.
    #[error(transparent)]
    SmNames(#[from] crate::capacity_names::SmNamesError),
    /// The SM share is no quantity.
    #[error("consumedCapacity sm {0:?} is not a quantity")]
    SmQuantity(String),
    /// The SM share is not 1-100.
    #[error("consumedCapacity sm {0} is not a percentage 1-100")]
    SmRange(u64),
    /// No device of this driver.
    #[error("the allocation has no device of driver {0}")]
    NoDevice(String),
    /// One GPU twice without share IDs.
    #[error("GPU {uuid} is allocated twice to the claim (requests {first:?} and {second:?}) without distinct share IDs")]
    Twice {
        /// The GPU.
        uuid: String,
        /// The first request.
        first: String,
        /// The second request.
        second: String,
    },
    /// A GPU's shares ask for more memory than it has.
    #[error("the shares of GPU {uuid} consume {memory} bytes of memory together, the device has {total}")]
    SharesMemory {
        /// The GPU.
        uuid: String,
        /// Asked, together.
        memory: u64,
        /// The device's memory.
        total: u64,
    },
    /// A GPU's shares carry different configurations.
    #[error(
        "the shares of GPU {uuid} (requests {first:?} and {second:?}) carry different configurations; the GPU \
         has one limits entry"
    )]
    SharesConfig {
        /// The GPU.
        uuid: String,
        /// The first request.
        first: String,
        /// The second request.
        second: String,
    },
    /// A GPU's shares ask for more than all of its SM time.
    #[error("the shares of GPU {uuid} consume {sm} % of its SM time together")]
    SharesSm {
        /// The GPU.
        uuid: String,
        /// Asked, together (percent).
        sm: u32,
    },
    /// An opaque configuration that is not a GpuConfig.
    #[error("{from} configuration for {driver}: {error}")]
    Config {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// The driver.
        driver: String,
        /// serde's message.
        error: String,
    },
    /// An opaque configuration of another apiVersion or kind.
    #[error("{from} configuration: expected apiVersion {CONFIG_API_VERSION} kind {CONFIG_KIND}, got {api_version} {kind}")]
    ConfigKind {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Its apiVersion.
        api_version: String,
        /// Its kind.
        kind: String,
    },
    /// A policy that is not hard, burst or default.
    #[error("{from}: policy {value:?}: expected hard, burst or default")]
    Policy {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Given.
        value: String,
    },
    /// A priority that is not high or low.
    #[error("{from}: priority {value:?}: expected high or low")]
    Priority {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Given.
        value: String,
    },
    /// reservedMemory is no quantity.
    #[error("{from}: reservedMemory {value:?} is not a quantity")]
    ReservedMemory {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Given.
        value: String,
    },
    /// A weight outside 1-1000.
    #[error("{from}: weight {value}: expected 1-1000")]
    Weight {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Given.
        value: u32,
    },
    /// memoryLimit is no quantity.
    #[error("{from}: memoryLimit {value:?} is not a quantity")]
    MemoryLimitQuantity {
        /// `FromClass` or `FromClaim`.
        from: String,
        /// Given.
        value: String,
    },
    /// The claim's memoryLimit is below its grant (the request) or above the device.
    #[error(
        "the claim's memoryLimit {limit} bytes is not within its granted memory (the request, {request} bytes) \
         and the device's {device} bytes"
    )]
    MemoryLimitRange {
        /// The claim's memoryLimit.
        limit: u64,
        /// consumedCapacity memory.
        request: u64,
        /// The device's memory.
        device: u64,
    },
    /// An elastic grant (memoryLimit) of a GPU held under several share IDs.
    #[error("GPU {uuid} is held under several share IDs with a memoryLimit: a shared GPU cannot be elastic")]
    SharesElastic {
        /// The GPU.
        uuid: String,
    },
    /// The claim asks for more than its DeviceClass allows.
    #[error(
        "the claim's {what} {asked} goes beyond its DeviceClass's {class}: a claim may only ask for less than its \
         class (lower priority, stricter policy, smaller weight, more reservedMemory, memoryLimit at most the \
         class's)"
    )]
    BeyondClass {
        /// The parameter.
        what: String,
        /// The claim's value.
        asked: String,
        /// The class's value.
        class: String,
    },
}

impl ResourceClaim {
    /// The grants of this driver's devices. Errors (a claim the node cannot honour) name what is wrong.
    pub fn grants(&self, driver: &str, inventory: &Inventory) -> Result<Grants, ClaimError> {
        let alloc = self.status.allocation.as_ref().ok_or(ClaimError::NotAllocated)?;
        let mut devices = Vec::new();
        for r in alloc.devices.results.iter().filter(|r| r.driver == driver) {
            let gpu = inventory
                .by_name(&r.device)
                .ok_or_else(|| ClaimError::UnknownDevice {
                    device: r.device.clone(),
                    pool: r.pool.clone(),
                    known: inventory.names().join(", "),
                })?;
            if r.pool != inventory.pool {
                return Err(ClaimError::OtherPool {
                    device: r.device.clone(),
                    pool: r.pool.clone(),
                    node_pool: inventory.pool.clone(),
                });
            }
            let memory = match r.consumed_capacity.get(CAPACITY_MEMORY) {
                Some(q) => quantity::parse(q).ok_or_else(|| ClaimError::MemoryQuantity(q.clone()))?,
                None => gpu.memory,
            };
            if memory == 0 || memory > gpu.memory {
                return Err(ClaimError::MemoryRange {
                    memory,
                    device: gpu.memory,
                });
            }
            let sm = match crate::capacity_names::consumed_sm(&r.consumed_capacity)? {
                Some(q) => {
                    let v = quantity::parse(q).ok_or_else(|| ClaimError::SmQuantity(q.clone()))?;
                    if !(1..=100).contains(&v) {
                        return Err(ClaimError::SmRange(v));
                    }
                    (v < 100).then_some(v as u32)
                }
                None => None,
            };
            let class = Settings::parse("FromClass", &merged(alloc, driver, &r.request, "FromClass")?)?;
            let claim = Settings::parse("FromClaim", &merged(alloc, driver, &r.request, "FromClaim")?)?;
            let cfg = class.bound(&claim)?;
            // The claim's own limit must hold its grant and fit the device; the class's is a ceiling for any GPU
            // size, so it is clamped to the device and never taken below the grant.
            if let Some(l) = claim.memory_limit.filter(|&l| l < memory || l > gpu.memory) {
                return Err(ClaimError::MemoryLimitRange {
                    limit: l,
                    request: memory,
                    device: gpu.memory,
                });
            }
            let memory_limit = cfg
                .memory_limit
                .map(|l| l.min(gpu.memory))
                .filter(|&l| l > memory);
            devices.push(Grant {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                share_id: r.share_id.clone(),
                uuid: gpu.uuid.clone(),
                memory,
                memory_limit,
                sm,
                policy: cfg.policy.unwrap_or_default().as_str().into(),
                priority: cfg.priority.map(|p| p.as_str().into()),
                reserved_memory: cfg.reserved_memory,
                weight: cfg.weight,
            });
        }
        if devices.is_empty() {
            return Err(ClaimError::NoDevice(driver.to_string()));
        }
        for (i, g) in devices.iter().enumerate() {
            let distinct =
                |h: &Grant| g.share_id.is_some() && h.share_id.is_some() && g.share_id != h.share_id;
            if let Some(h) = devices[..i].iter().find(|h| h.uuid == g.uuid && !distinct(h)) {
                return Err(ClaimError::Twice {
                    uuid: g.uuid.clone(),
                    first: h.request.clone(),
                    second: g.request.clone(),
                });
            }
        }
        let grants = Grants {
            devices,
            pods: Vec::new(),
        };
        for g in grants.per_gpu()? {
            let total = inventory
                .gpus
                .iter()
                .find(|x| x.uuid == g.uuid)
                .map_or(0, |x| x.memory);
            if g.memory > total {
                return Err(ClaimError::SharesMemory {
                    uuid: g.uuid.clone(),
                    memory: g.memory,
                    total,
                });
            }
        }
        let devices = grants.devices;
        Ok(Grants {
            devices,
            pods: self.pods(),
        })
    }

    /// The pods the claim is reserved for: (name, uid).
    pub fn pods(&self) -> Vec<(String, String)> {
        self.status
            .reserved_for
            .iter()
            .filter(|c| c.resource == "pods" && !c.uid.is_empty())
            .map(|c| (c.name.clone(), c.uid.clone()))
            .collect()
    }
}

impl Grants {
    /// One grant per GPU: the shares of a GPU the claim holds under several share IDs summed (memory, SM
    /// share; 100 % or more of SM is the whole device, more than 100 % an error), in first-seen order. The
    /// shares must carry the same configuration: the GPU has one limits entry.
    pub fn per_gpu(&self) -> Result<Vec<Grant>, ClaimError> {
        let mut out: Vec<Grant> = Vec::new();
        for g in &self.devices {
            let Some(m) = out.iter_mut().find(|m| m.uuid == g.uuid) else {
                out.push(g.clone());
                continue;
            };
            if m.memory_limit.is_some() || g.memory_limit.is_some() {
                return Err(ClaimError::SharesElastic { uuid: g.uuid.clone() });
            }
            let cfg = |x: &Grant| (x.policy.clone(), x.priority.clone(), x.reserved_memory, x.weight);
            if cfg(m) != cfg(g) {
                return Err(ClaimError::SharesConfig {
                    uuid: g.uuid.clone(),
                    first: m.request.clone(),
                    second: g.request.clone(),
                });
            }
            let sm = m.sm.unwrap_or(100) + g.sm.unwrap_or(100);
            if sm > 100 {
                return Err(ClaimError::SharesSm {
                    uuid: g.uuid.clone(),
                    sm,
                });
            }
            m.memory = m.memory.saturating_add(g.memory);
            m.sm = (sm < 100).then_some(sm);
            m.share_id = None;
        }
        Ok(out)
    }
}

/// The request a result names without its subrequest (`req/sub` → `req`), as upstream's
/// `resourceclaim.BaseRequestRef` does: the kubelet matches containers' `resources.claims[].request` to it.
pub fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// One source's configuration for `request` (`FromClass` or `FromClaim`): its entries in order, later fields
/// winning.
fn merged(alloc: &Allocation, driver: &str, request: &str, source: &str) -> Result<GpuConfig, ClaimError> {
    let parent = base_request(request);
    let mut out = GpuConfig::default();
    for c in alloc.devices.config.iter().filter(|c| c.source == source) {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        if !c.requests.is_empty() && !c.requests.iter().any(|r| r == request || r == parent) {
            continue;
        }
        let g: GpuConfig = serde_json::from_value(o.parameters.clone()).map_err(|e| ClaimError::Config {
            from: source.to_string(),
            driver: driver.to_string(),
            error: e.to_string(),
        })?;
        if g.api_version != CONFIG_API_VERSION || g.kind != CONFIG_KIND {
            return Err(ClaimError::ConfigKind {
                from: source.to_string(),
                api_version: g.api_version,
                kind: g.kind,
            });
        }
        out.policy = g.policy.or(out.policy);
        out.priority = g.priority.or(out.priority);
        out.reserved_memory = g.reserved_memory.or(out.reserved_memory);
        out.weight = g.weight.or(out.weight);
        out.memory_limit = g.memory_limit.or(out.memory_limit);
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
    memory_limit: Option<u64>,
}

impl Settings {
    fn parse(source: &str, cfg: &GpuConfig) -> Result<Settings, ClaimError> {
        let policy = match cfg.policy.as_deref() {
            None => None,
            Some(p) => match PolicyKind::parse(p) {
                Some(PolicyKind::Disabled) | None => {
                    return Err(ClaimError::Policy {
                        from: source.to_string(),
                        value: p.to_string(),
                    })
                }
                k => k,
            },
        };
        let priority = match cfg.priority.as_deref() {
            None => None,
            Some(p) => Some(Priority::parse(p).ok_or_else(|| ClaimError::Priority {
                from: source.to_string(),
                value: p.to_string(),
            })?),
        };
        let reserved_memory = match cfg.reserved_memory.as_deref() {
            None => None,
            Some(q) => Some(quantity::parse(q).ok_or_else(|| ClaimError::ReservedMemory {
                from: source.to_string(),
                value: q.to_string(),
            })?),
        };
        let memory_limit = match cfg.memory_limit.as_deref() {
            None => None,
            Some(q) => Some(quantity::parse(q).ok_or_else(|| ClaimError::MemoryLimitQuantity {
                from: source.to_string(),
                value: q.to_string(),
            })?),
        };
        if let Some(w) = cfg.weight.filter(|w| !(1..=1000).contains(w)) {
            return Err(ClaimError::Weight {
                from: source.to_string(),
                value: w,
            });
        }
        Ok(Settings {
            policy,
            priority,
            reserved_memory,
            weight: cfg.weight,
            memory_limit,
        })
    }

    /// The class's settings (`self`) with the claim's where the claim asks for no more: a lower priority, a
    /// stricter policy, a smaller weight, a larger reservation. A claim asking for more is refused, naming the
    /// parameter (docs/kubernetes.md, "The class bounds the claim"): the class is the operator's, the claim the
    /// pod author's.
    fn bound(&self, claim: &Settings) -> Result<Settings, ClaimError> {
        let refuse = |what: &str, asked: String, class: String| {
            Err(ClaimError::BeyondClass {
                what: what.to_string(),
                asked,
                class,
            })
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
        // Unset in the class: its claims are not elastic (nothing above their grant).
        if let Some(l) = claim
            .memory_limit
            .filter(|&l| self.memory_limit.is_none_or(|c| l > c))
        {
            let class = self
                .memory_limit
                .map_or("unset (no memory above the grant)".into(), |c| {
                    format!("{c} bytes")
                });
            return refuse("memoryLimit", format!("{l} bytes"), class);
        }
        Ok(Settings {
            policy: match (self.policy, claim.policy) {
                (Some(a), Some(b)) => Some(PolicyKind::stricter(a, b)),
                (a, b) => b.or(a),
            },
            priority: claim.priority.or(self.priority),
            reserved_memory: claim.reserved_memory.or(self.reserved_memory),
            weight: claim.weight.or(self.weight),
            memory_limit: claim.memory_limit.or(self.memory_limit),
        })
    }
}
