//! The shared region: fixed-size files mapped into the processes that use them.
//!
//! - **limits** ([`LimitsRegion`], [`LimitsReader`], [`LimitsWriter`]): written by the node agent, mapped
//!   read-only by the shim (mount it read-only into the container). A seqlock lets readers take consistent
//!   snapshots without ever waiting on a writer; a writer that dies mid-write leaves readers on their last good
//!   snapshot and is taken over by the next writer.
//! - **usage** ([`UsageRegion`]): shared read-write by the container's processes: one slot per process
//!   (memory charged per device, GPU time), one entry per physical device (claimed by UUID; throttle state).
//!   Admission is reserve-then-sum, exact under races, with no lock at all: nothing a dead process could hold.
//! - **priority** ([`PriorityRegion`]): one per node, shared read-write by every container with a priority on
//!   a GPU: what high-priority tenants publish, the best-effort queue token, in-flight reservations
//!   (docs/priority.md).
//!
//! Why no locks: HAMi-core's cross-process semaphores hang or take tens of seconds when a holder dies or
//! hundreds of processes start at once. Here every shared word is an atomic, every transition is a single
//! compare-and-swap, and a dead process's state is recognised (pid + start time) and reclaimed by whoever
//! notices. See `docs/region.md` for the protocols and `include/cuquota.h` for the C layout.

mod claim;
mod error;
mod fault;
pub mod hami;
mod header;
pub mod layout;
mod limits;
pub mod liveness;
mod map;
mod priority;
mod usage;

pub use error::RegionError;
pub use fault::uninstall_sigbus_handler;
pub use limits::{
    BadUsagePath, DeviceSelector, LimitsEntryData, LimitsReader, LimitsRegion, LimitsSnapshot, LimitsTable,
    LimitsWriter, MembersError, ReadError, TableFull, UnreadableBinding,
};
pub use map::FileId;
pub use priority::{
    HpState, Inflight, PriorityDeviceId, PriorityDeviceInfo, PriorityEntry, PriorityPeers, PriorityRegion,
    COUNTERS_SUFFIX, HIGH_SUFFIX, HP_MAX_AHEAD_NS, INFLIGHT_TTL_S, MAX_PEERS, PEER_SCAN_NS,
    TOKEN_MAX_AHEAD_NS,
};
pub use usage::{DeviceId, DeviceInfo, OverLimit, ProcessInfo, SlotId, SlotState, UsageRegion};
