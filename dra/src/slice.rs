//! The ResourceSlice (`resource.k8s.io/v1`) the driver publishes for its node: one device per GPU, shareable
//! by several claims (`allowMultipleAllocations`), with two consumable capacities: `memory` (bytes) and `sm`
//! (percent of the GPU's SM time). The scheduler's allocator keeps each device's granted sums within them.

use serde_json::{json, Value};

use crate::claim::CAPACITY_MEMORY;
use crate::inventory::Inventory;
use crate::quantity::format_bytes;

/// The smallest memory grant and its step: the scheduler rounds a request up to it.
pub const MEMORY_STEP: u64 = 256 << 20;
/// The memory a request that names none consumes.
pub const MEMORY_DEFAULT: u64 = 1 << 30;
/// The SM share (percent) a request that names none consumes.
pub const SM_DEFAULT: u32 = 10;

/// The node's ResourceSlice (one pool, one slice, generation `generation`).
pub fn resource_slice(driver: &str, inv: &Inventory, generation: i64) -> Value {
    let devices: Vec<Value> = inv
        .gpus
        .iter()
        .map(|g| {
            let mut attributes = json!({
                "uuid": {"string": g.uuid},
                "model": {"string": g.model},
                "productName": {"string": g.model},
            });
            let d = &g.details;
            for (name, kind, value) in [
                ("architecture", "string", &d.architecture),
                ("cudaComputeCapability", "version", &d.compute_capability),
                ("driverVersion", "version", &d.driver_version),
                ("pcieBusID", "string", &d.pci_bus_id),
                ("resource.kubernetes.io/pciBusID", "string", &d.pci_bus_id),
                ("resource.kubernetes.io/pcieRoot", "string", &d.pcie_root),
            ] {
                if let Some(v) = value {
                    attributes[name] = json!({ kind: v });
                }
            }
            json!({
                "name": g.name,
                "attributes": attributes,
                "capacity": {
                    CAPACITY_MEMORY: {
                        "value": format_bytes(g.memory),
                        "requestPolicy": {
                            "default": format_bytes(MEMORY_DEFAULT.min(g.memory)),
                            "validRange": {
                                "min": format_bytes(MEMORY_STEP),
                                "max": format_bytes(g.memory / MEMORY_STEP * MEMORY_STEP),
                                "step": format_bytes(MEMORY_STEP),
                            },
                        },
                    },
                    crate::capacity_names::sm_published(): {
                        "value": "100",
                        "requestPolicy": {
                            "default": SM_DEFAULT.to_string(),
                            "validRange": {"min": "1", "max": "100", "step": "1"},
                        },
                    },
                },
                "allowMultipleAllocations": true,
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{}-{}", inv.pool, driver)},
        "spec": {
            "driver": driver,
            "nodeName": inv.pool,
            "pool": {"name": inv.pool, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}
