//! The process-local object tables (contexts, streams, events, modules, graphs, pools, arrays, memory) behind
//! one mutex, and the handle values the C API hands out.
//!
//! One lock keeps every multi-object operation (destroying a context frees its streams, memory, modules…)
//! atomic and thread-safe. Nothing sleeps while holding it: waits compute a deadline, drop the guard and
//! sleep (see `timeline::sleep_until`). Handles are opaque numbers that encode their kind, so a stream passed
//! where an event is expected is an invalid handle, and a destroyed object's handle is never reused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::array::{Array, Mipmap};
use crate::context::{Context, Primary};
use crate::graph::{Graph, GraphExec, GraphNode};
use crate::memory::Memory;
use crate::module::{Function, Kernel, Library, Module};
use crate::pool::Pool;
use crate::stream::{Event, Stream};
use crate::vmm::Vmm;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Kind {
    Context = 1,
    Stream,
    Event,
    Module,
    Function,
    Library,
    Kernel,
    Graph,
    GraphNode,
    GraphExec,
    Pool,
    Array,
    Mipmap,
    VmmHandle,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh handle value of `kind` (never 0, 1 or 2, which mean default streams).
pub(crate) fn new_handle(kind: Kind) -> u64 {
    0x5100_0000_0000 | ((kind as u64) << 36) | (NEXT_ID.fetch_add(1, Relaxed) << 4)
}

/// Every live object of this process.
#[derive(Default)]
pub(crate) struct Objects {
    pub contexts: HashMap<u64, Context>,
    /// Contexts destroyed by cuCtxDestroy (handles are never reused): a thread they are still current to
    /// gets CUDA_ERROR_CONTEXT_IS_DESTROYED.
    pub destroyed: HashSet<u64>,
    /// Primary context per CUDA ordinal.
    pub primaries: Vec<Primary>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub libraries: HashMap<u64, Library>,
    pub kernels: HashMap<u64, Kernel>,
    pub graphs: HashMap<u64, Graph>,
    pub nodes: HashMap<u64, GraphNode>,
    pub execs: HashMap<u64, GraphExec>,
    /// Conditional handles (cuGraphConditionalHandleCreate): the value each graph launch starts with.
    pub cond_handles: HashMap<u64, crate::graph::CondHandle>,
    /// Kernel nodes whose kernel launches a device-launchable exec (its handle is their first parameter).
    pub device_launches: HashMap<u64, u64>,
    /// Kernel nodes whose kernel sets a conditional handle: (handle, value), from their first two parameters.
    pub cond_setters: HashMap<u64, (u64, u32)>,
    pub pools: HashMap<u64, Pool>,
    /// (default pool, current pool) per CUDA ordinal; 0 = not created yet.
    pub device_pools: Vec<(u64, u64)>,
    pub arrays: HashMap<u64, Array>,
    pub mipmaps: HashMap<u64, Mipmap>,
    pub mem: Memory,
    /// Managed memory's residency (`CUDASIM_MANAGED=migrate`).
    pub managed: crate::managed::Managed,
    /// Graph memory pool per CUDA ordinal.
    pub graph_pools: HashMap<usize, crate::graph_mem::GraphPool>,
    /// Alloc node address ranges → references (the node, and each exec holding it).
    pub graph_vas: HashMap<u64, u32>,
    pub vmm: Vmm,
    pub ipc: crate::ipc::Ipc,
    /// Per (physical device): the last ring interval this process wrote (index, end), to extend it when
    /// the next kernel follows on directly.
    pub last_interval: BTreeMap<usize, (u64, u64)>,
    /// Per device: the time-slicing shifts already applied to this process's times (`timeline::catch_up`).
    pub shifts_seen: [u64; crate::config::MAX_DEVICES],
    /// Memory effects of kernels and copies waiting for their time on the timeline (`touch`).
    pub pending: crate::touch::Pending,
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

/// Runs `f` with the object tables locked.
pub(crate) fn with<T>(f: impl FnOnce(&mut Objects) -> T) -> T {
    let mut g = OBJECTS.lock();
    let o = g.get_or_insert_with(Objects::default);
    crate::timeline::catch_up(o);
    crate::touch::drain(o);
    f(o)
}
