//! The stack the driver grows at a launch: a kernel's local memory per thread beyond the context's stack size,
//! for every thread the device holds. Priced alike for a direct launch, a graph's kernels and `cuCtxSetLimit`.
//! The driver is asked through [`Driver`] (unit-tested with a fake below).

use super::driver::Driver;
use crate::devices::Dev;
use crate::ffi::cuda::*;

/// Device memory a per-thread stack of `per_thread` bytes takes: one for every thread the device can hold.
pub(crate) fn bytes(d: &impl Driver, dev: Dev, per_thread: u64) -> u64 {
    let attr = |a: CUdevice_attribute| {
        d.device_attribute(a, dev.ordinal)
            .ok()
            .filter(|&n| n > 0)
            .map(|n| n as u64)
    };
    // Unknown: as many as today's largest GPUs hold (fail towards charging).
    let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(192);
    let threads = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR).unwrap_or(2048);
    per_thread.saturating_mul(sms * threads)
}

/// The local memory per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`) of `f`, a `CUfunction` or a `CUkernel`
/// (asked for device `ordinal`). `Some(0)` for a handle the driver knows as neither (its launch fails there
/// too); `None` when the driver will not say (fail closed: the caller refuses under a cap).
pub(crate) fn local_size(d: &impl Driver, f: CUfunction, ordinal: CUdevice) -> Option<u64> {
    let r = match d.function_local_size(f) {
        Ok(n) => return Some(n.max(0) as u64),
        Err(r) => r,
    };
    let k = match d.kernel_local_size(f, ordinal) {
        Ok(n) => return Some(n.max(0) as u64),
        Err(k) => k,
    };
    let bad_handle =
        |r: CUresult| matches!(r, CUresult::ERROR_INVALID_HANDLE | CUresult::ERROR_INVALID_VALUE);
    (bad_handle(r) && bad_handle(k)).then_some(0)
}

/// The current context's stack size per thread; 0 when the driver will not say (the whole need is admitted).
pub(crate) fn size(d: &impl Driver) -> u64 {
    d.stack_size().map_or(0, |n| n as u64)
}

/// The local memory per thread of the kernel a node's parameters name (`kern` when `func` is NULL), read as a
/// direct launch of it reads it ([`local_size`]), whether or not a context is current (an update needs
/// none): a library kernel's on every device, the largest. `None`: the driver will not say.
pub(crate) fn node_local(d: &impl Driver, func: CUfunction, kern: CUkernel) -> Option<u64> {
    let f = if func.is_null() { kern as CUfunction } else { func };
    if f.is_null() {
        return Some(0);
    }
    match d.device_count() {
        Ok(n) if n >= 1 => (0..n)
            .map(|o| local_size(d, f, o))
            .try_fold(0, |m, l| Some(m.max(l?))),
        _ => local_size(d, f, 0),
    }
}

/// What the first launch or upload of a graph exec in the current context makes the driver grow its stack by:
/// `local`, the largest local memory its kernels need (recorded at instantiation and update: `graphs`), beyond
/// the context's stack size, for every thread the device holds ([`bytes`], as a direct launch's growth and
/// `cuCtxSetLimit` are priced). Admitted by `FirstUse::first_launch`, the one routine every launch path takes.
pub(super) fn graph_growth(d: &impl Driver, dev: Dev, local: u64) -> u64 {
    if local == 0 {
        return 0;
    }
    bytes(d, dev, local.saturating_sub(size(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tests::device_id;

    /// A driver that answers the stack's queries from fields (`Err`: the driver refuses).
    struct Fake {
        sms: Result<i32, CUresult>,
        threads: Result<i32, CUresult>,
        function: Result<i32, CUresult>,
        kernel: Result<i32, CUresult>,
        stack: Result<usize, CUresult>,
    }

    impl Driver for Fake {
        fn device_attribute(&self, attr: CUdevice_attribute, _: CUdevice) -> Result<i32, CUresult> {
            match attr {
                CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => self.sms,
                CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => self.threads,
                _ => Err(CUresult::ERROR_INVALID_VALUE),
            }
        }
        fn function_local_size(&self, _: CUfunction) -> Result<i32, CUresult> {
            self.function
        }
        fn kernel_local_size(&self, _: CUfunction, _: CUdevice) -> Result<i32, CUresult> {
            self.kernel
        }
        fn stack_size(&self) -> Result<usize, CUresult> {
            self.stack
        }
        fn device_count(&self) -> Result<i32, CUresult> {
            Ok(1)
        }
        // No graphs here.
        fn graph_nodes(&self, _: CUgraph) -> Result<Vec<CUgraphNode>, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn node_type(&self, _: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn child_graph(&self, _: CUgraphNode) -> Result<CUgraph, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn alloc_node(&self, _: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn kernel_node(&self, _: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn graph_mem_attribute(&self, _: CUdevice, _: CUgraphMem_attribute) -> Result<u64, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        // Nor pools.
        fn pool_attribute(&self, _: usize, _: CUmemPool_attribute) -> Result<u64, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn mem_pool(&self, _: CUdevice) -> Result<usize, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn default_mem_pool(&self, _: CUdevice) -> Result<usize, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn pointer_device(&self, _: u64) -> Result<i32, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn address_size(&self, _: u64) -> Result<usize, CUresult> {
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
    }

    const H100: Fake = Fake {
        sms: Ok(132),
        threads: Ok(2048),
        function: Ok(16 << 10),
        kernel: Err(CUresult::ERROR_INVALID_HANDLE),
        stack: Ok(1024),
    };

    #[test]
    fn the_stack_is_priced_for_every_thread_the_device_holds() {
        let (_t, id) = device_id();
        let dev = Dev { ordinal: 0, id };
        let f = 0x1000 as CUfunction;
        assert_eq!(bytes(&H100, dev, 1024), 1024 * 132 * 2048);
        // A driver that will not say how many threads: today's largest GPU's (fail towards charging).
        let mute = Fake {
            sms: Err(CUresult::ERROR_INVALID_VALUE),
            threads: Ok(0),
            ..H100
        };
        assert_eq!(bytes(&mute, dev, 1024), 1024 * 192 * 2048);
        // A launch's growth is its local memory beyond the context's stack size.
        assert_eq!(local_size(&H100, f, 0), Some(16 << 10));
        assert_eq!(
            graph_growth(&H100, dev, 16 << 10),
            ((16 << 10) - 1024) * 132 * 2048
        );
        assert_eq!(graph_growth(&H100, dev, 512), 0, "within the stack");
        // A library kernel's; a handle the driver knows as neither; a driver that refuses (fail closed).
        let kernel = Fake {
            function: Err(CUresult::ERROR_INVALID_HANDLE),
            kernel: Ok(4096),
            ..H100
        };
        assert_eq!(local_size(&kernel, f, 0), Some(4096));
        let neither = Fake {
            function: Err(CUresult::ERROR_INVALID_HANDLE),
            ..H100
        };
        assert_eq!(local_size(&neither, f, 0), Some(0));
        let refuses = Fake {
            function: Err(CUresult::ERROR_NOT_SUPPORTED),
            ..neither
        };
        assert_eq!(local_size(&refuses, f, 0), None);
        assert_eq!(node_local(&refuses, f, std::ptr::null_mut()), None);
    }
}
