//! Modules, libraries, functions, kernels and launches (cuModule*, cuLibrary*, cuKernel*, cuFunc*, cuLaunch*).

use std::ffi::{c_char, c_void};

use super::{alias, cstr, cuda_fn, h, hp, out, read};
use crate::context;
use crate::graph::KernelLaunch;
use crate::launch::launch;
use crate::module::{self, Image};
use crate::objects::with;
use crate::sim::cuda;
use crate::types::*;

fn load_module(pm: *mut Handle, image: CuResult<Image>) -> CuResult<()> {
    let sim = cuda()?;
    if pm.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let image = image?;
    // Modules load eagerly: code for another GPU fails here (libraries fail at their first lookup).
    image.runs_here()?;
    let m = with(|o| -> CuResult<u64> {
        let c = context::current(o, sim)?;
        module::load(o, sim, c, std::sync::Arc::new(image), None)
    })?;
    // SAFETY: checked non-NULL.
    unsafe { out(pm, hp(m)) }
}

fn get_global(dptr: *mut u64, bytes: *mut usize, m: Handle, name: *const c_char) -> CuResult<()> {
    // SAFETY: the caller's arguments per cuModuleGetGlobal; out-pointers are optional.
    unsafe {
        let name = cstr(name)?;
        let sim = cuda()?;
        let found = with(|o| module::get_global(o, sim, h(m), &name));
        super::log(|| format!("global {name:?} -> {found:x?}"));
        let (p, n) = found?;
        if !dptr.is_null() {
            *dptr = p;
        }
        if !bytes.is_null() {
            *bytes = n as usize;
        }
    }
    Ok(())
}

fn library_load(pl: *mut Handle, image: CuResult<Image>) -> CuResult<()> {
    let sim = cuda()?;
    if pl.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let image = image?;
    let l = with(|o| module::library_load(o, sim, image))?;
    // SAFETY: checked non-NULL.
    unsafe { out(pl, hp(l)) }
}

fn kernel(f: Handle, grid: [u32; 3], block: [u32; 3], params: *mut *mut c_void) -> KernelLaunch {
    KernelLaunch {
        func: h(f),
        grid,
        block,
        params: params as u64,
    }
}

/// Function attribute values (an H100-like compiled kernel).
fn func_attribute(attrib: i32, max_dyn_shared: i32, local: u64) -> CuResult<i32> {
    Ok(match attrib {
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => local.min(i32::MAX as u64) as i32,
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
        CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => max_dyn_shared,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
        a if (0..CU_FUNC_ATTRIBUTE_MAX).contains(&a) => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn launch_ex(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void) -> CuResult<()> {
    let sim = cuda()?;
    // SAFETY: the caller's CUlaunchConfig; attrs points to numAttrs entries.
    let (c, coop) = unsafe {
        let c = read(config)?;
        let mut coop = false;
        if c.num_attrs > 0 && c.attrs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..c.num_attrs as usize {
            let a = read(c.attrs.add(i))?;
            if a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                && i32::from_ne_bytes([a.value[0], a.value[1], a.value[2], a.value[3]]) != 0
            {
                coop = true;
            }
        }
        (c, coop)
    };
    launch(sim, h(c.stream), &[kernel(f, c.grid, c.block, params)], coop)
}

/// The cluster size (blocks) a launch configuration asks for with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (None:
/// not given), and its block count per SM at full occupancy.
fn cluster_config(config: *const LaunchConfig) -> CuResult<(Option<u32>, u32)> {
    // SAFETY: the caller's CUlaunchConfig; attrs points to numAttrs entries.
    unsafe {
        let c = read(config)?;
        if c.num_attrs > 0 && c.attrs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let threads = c.block.iter().try_fold(1u32, |a, &d| a.checked_mul(d));
        let threads = threads
            .filter(|t| (1..=1024).contains(t))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut size = None;
        for i in 0..c.num_attrs as usize {
            let a = read(c.attrs.add(i))?;
            if a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
                let d = |k: usize| {
                    u32::from_ne_bytes([a.value[k], a.value[k + 1], a.value[k + 2], a.value[k + 3]])
                };
                size = Some(d(0).saturating_mul(d(4)).saturating_mul(d(8)));
            }
        }
        Ok((size, (2048 / threads).clamp(1, 32)))
    }
}

fn legacy_launch(f: Handle, gw: i32, gh: i32, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    let block = with(|o| o.functions.get(&h(f)).map(|x| x.block)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if gw <= 0 || gh <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    launch(
        sim,
        h(s),
        &[kernel(f, [gw as u32, gh as u32, 1], block, std::ptr::null_mut())],
        false,
    )
}

cuda_fn! {
    fn cuModuleLoad(pm: *mut Handle, fname: *const c_char) {
        let path = cstr(fname)?;
        load_module(pm, module::read_image_file(&path))
    }

    fn cuModuleLoadData(pm: *mut Handle, image: *const c_void) {
        load_module(pm, module::read_image(image))
    }

    fn cuModuleLoadDataEx(pm: *mut Handle, image: *const c_void, n: u32, opts: *mut u32, vals: *mut *mut c_void) {
        load_module(pm, module::read_image(image))
    }

    fn cuModuleLoadFatBinary(pm: *mut Handle, fatbin: *const c_void) {
        load_module(pm, module::read_image(fatbin))
    }

    fn cuModuleUnload(m: Handle) {
        let sim = cuda()?;
        with(|o| -> CuResult<()> {
            if o.modules.get(&h(m)).is_some_and(|m| m.library.is_some()) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            module::unload(o, sim, h(m))
        })
    }

    fn cuModuleGetFunction(pf: *mut Handle, m: Handle, name: *const c_char) {
        let sim = cuda()?;
        let name = cstr(name)?;
        if pf.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pf, hp(with(|o| module::get_function(o, sim, h(m), &name))?))
    }

    fn cuModuleGetGlobal_v2(dptr: *mut u64, bytes: *mut usize, m: Handle, name: *const c_char) {
        get_global(dptr, bytes, m, name)
    }

    fn cuModuleGetGlobal(dptr: *mut u32, bytes: *mut u32, m: Handle, name: *const c_char) {
        let (mut p, mut n) = (0u64, 0usize);
        get_global(&mut p, &mut n, m, name)?;
        if !dptr.is_null() {
            *dptr = p as u32;
        }
        if !bytes.is_null() {
            *bytes = n as u32;
        }
        Ok(())
    }

    fn cuModuleGetLoadingMode(mode: *mut u32) {
        cuda()?;
        out(mode, 1) // CU_MODULE_LAZY_LOADING
    }

    fn cuLibraryLoadData(
        pl: *mut Handle,
        code: *const c_void,
        jit_opts: *mut u32,
        jit_vals: *mut *mut c_void,
        n_jit: u32,
        lib_opts: *mut u32,
        lib_vals: *mut *mut c_void,
        n_lib: u32,
    ) {
        library_load(pl, module::read_image(code))
    }

    fn cuLibraryLoadFromFile(
        pl: *mut Handle,
        file: *const c_char,
        jit_opts: *mut u32,
        jit_vals: *mut *mut c_void,
        n_jit: u32,
        lib_opts: *mut u32,
        lib_vals: *mut *mut c_void,
        n_lib: u32,
    ) {
        let path = cstr(file)?;
        library_load(pl, module::read_image_file(&path))
    }

    fn cuLibraryUnload(l: Handle) {
        let sim = cuda()?;
        with(|o| module::library_unload(o, sim, h(l)))
    }

    fn cuLibraryGetKernel(pk: *mut Handle, l: Handle, name: *const c_char) {
        cuda()?;
        let name = cstr(name)?;
        if pk.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pk, hp(with(|o| module::library_get_kernel(o, h(l), &name))?))
    }

    fn cuLibraryGetModule(pm: *mut Handle, l: Handle) {
        let sim = cuda()?;
        if pm.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let m = with(|o| -> CuResult<u64> {
            let c = context::current(o, sim)?;
            module::library_module(o, sim, h(l), c)
        })?;
        out(pm, hp(m))
    }

    fn cuLibraryGetGlobal(dptr: *mut u64, bytes: *mut usize, l: Handle, name: *const c_char) {
        let sim = cuda()?;
        let m = with(|o| -> CuResult<u64> {
            let c = context::current(o, sim)?;
            module::library_module(o, sim, h(l), c)
        })?;
        get_global(dptr, bytes, hp(m), name)
    }

    fn cuKernelGetFunction(pf: *mut Handle, k: Handle) {
        let sim = cuda()?;
        if pf.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let f = with(|o| -> CuResult<u64> {
            if !o.kernels.contains_key(&h(k)) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            let c = context::current(o, sim)?;
            Ok(module::function_for(o, sim, h(k), c)?.0)
        })?;
        out(pf, hp(f))
    }

    fn cuKernelGetLibrary(pl: *mut Handle, k: Handle) {
        cuda()?;
        if pl.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let l = with(|o| o.kernels.get(&h(k)).map(|k| k.library).ok_or(CUDA_ERROR_INVALID_HANDLE))?;
        out(pl, hp(l))
    }

    fn cuKernelGetAttribute(pi: *mut i32, attrib: i32, k: Handle, dev: CUdevice) {
        cuda()?.phys(dev)?;
        let local = with(|o| {
            let k = o.kernels.get(&h(k))?;
            Some(o.libraries.get(&k.library).map_or(0, |l| l.image.local(&k.name)))
        })
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pi, func_attribute(attrib, 48 * 1024, local)?)
    }

    fn cuKernelSetAttribute(attrib: i32, val: i32, k: Handle, dev: CUdevice) {
        cuda()?.phys(dev)?;
        with(|o| o.kernels.contains_key(&h(k))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuKernelSetCacheConfig(k: Handle, config: u32, dev: CUdevice) {
        cuda()?.phys(dev)?;
        Ok(())
    }

    fn cuKernelGetName(name: *mut *const c_char, k: Handle) {
        cuda()?;
        let n = with(|o| o.kernels.get(&h(k)).map(|k| k.name.clone())).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(name, crate::errors::c_static(Box::leak(n.into_boxed_str())))
    }

    fn cuFuncGetAttribute(pi: *mut i32, attrib: i32, f: Handle) {
        cuda()?;
        let (mds, local) = with(|o| o.functions.get(&h(f)).map(|f| (f.max_dynamic_shared, f.local)))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pi, func_attribute(attrib, mds.max(48 * 1024), local)?)
    }

    fn cuFuncSetAttribute(f: Handle, attrib: i32, value: i32) {
        cuda()?;
        with(|o| -> CuResult<()> {
            let func = o.functions.get_mut(&h(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            match attrib {
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES if (0..=227 * 1024).contains(&value) => {
                    func.max_dynamic_shared = value
                }
                CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT | 10..=15 => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }

    fn cuFuncSetCacheConfig(f: Handle, config: u32) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuFuncGetModule(pm: *mut Handle, f: Handle) {
        cuda()?;
        let m = with(|o| o.functions.get(&h(f)).map(|f| f.module)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pm, hp(m))
    }

    fn cuFuncGetName(name: *mut *const c_char, f: Handle) {
        cuda()?;
        let n = with(|o| o.functions.get(&h(f)).map(|f| f.name.clone())).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(name, crate::errors::c_static(Box::leak(n.into_boxed_str())))
    }

    fn cuFuncSetBlockShape(f: Handle, x: i32, y: i32, z: i32) {
        cuda()?;
        if x <= 0 || y <= 0 || z <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            o.functions.get_mut(&h(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.block = [x as u32, y as u32, z as u32];
            Ok(())
        })
    }

    fn cuFuncSetSharedSize(f: Handle, bytes: u32) {
        cuda()?;
        with(|o| -> CuResult<()> {
            o.functions.get_mut(&h(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.shared = bytes;
            Ok(())
        })
    }

    fn cuParamSetSize(f: Handle, n: u32) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuParamSeti(f: Handle, offset: i32, value: u32) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuParamSetf(f: Handle, offset: i32, value: f32) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuParamSetv(f: Handle, offset: i32, p: *mut c_void, n: u32) {
        cuda()?;
        with(|o| o.functions.contains_key(&h(f))).then_some(()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn cuLaunchKernel(
        f: Handle,
        gx: u32,
        gy: u32,
        gz: u32,
        bx: u32,
        by: u32,
        bz: u32,
        shared: u32,
        s: Handle,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        let sim = cuda()?;
        if !params.is_null() && !extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        launch(sim, h(s), &[kernel(f, [gx, gy, gz], [bx, by, bz], params)], false)
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, params)
    }

    fn cuLaunchCooperativeKernel(
        f: Handle,
        gx: u32,
        gy: u32,
        gz: u32,
        bx: u32,
        by: u32,
        bz: u32,
        shared: u32,
        s: Handle,
        params: *mut *mut c_void,
    ) {
        let sim = cuda()?;
        launch(sim, h(s), &[kernel(f, [gx, gy, gz], [bx, by, bz], params)], true)
    }

    fn cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, n: u32, flags: u32) {
        let sim = cuda()?;
        if list.is_null() || n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            let p = read(list.add(i))?;
            launch(sim, h(p.stream), &[kernel(p.function, p.grid, p.block, p.kernel_params)], true)?;
        }
        Ok(())
    }

    fn cuLaunch(f: Handle) {
        legacy_launch(f, 1, 1, std::ptr::null_mut())
    }

    fn cuLaunchGrid(f: Handle, gw: i32, gh: i32) {
        legacy_launch(f, gw, gh, std::ptr::null_mut())
    }

    fn cuLaunchGridAsync(f: Handle, gw: i32, gh: i32, s: Handle) {
        legacy_launch(f, gw, gh, s)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut i32, f: Handle, block: i32, dyn_smem: usize) {
        cuda()?;
        if block <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(n, (2048 / block).clamp(1, 32))
    }

    /// H100-like: 228 KiB of shared memory per SM, 1 KiB of it reserved per block, at most 227 KiB per block;
    /// 0 when `blocks` blocks of `block` threads cannot be resident on one SM at all. Simulated kernels use no
    /// static shared memory.
    fn cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, f: Handle, blocks: i32, block: i32) {
        cuda()?;
        if blocks <= 0 || !(1..=1024).contains(&block) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| o.functions.contains_key(&h(f)) || o.kernels.contains_key(&h(f)))
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let resident = (2048 / block).clamp(1, 32);
        let bytes = if blocks > resident {
            0
        } else {
            (228 * 1024 / blocks as usize).saturating_sub(1024).min(227 * 1024)
        };
        out(size, bytes)
    }

    /// Clusters are up to 8 blocks (portable) or 16 (H100's non-portable limit); the device holds as many as
    /// its SMs' resident blocks allow (no GPC boundaries are modelled).
    fn cuOccupancyMaxActiveClusters(n: *mut i32, f: Handle, config: *const LaunchConfig) {
        let sim = cuda()?;
        let (size, per_sm) = cluster_config(config)?;
        let size = size.filter(|s| (1..=16).contains(s)).ok_or(CUDA_ERROR_INVALID_CLUSTER_SIZE)?;
        let sms = with(|o| -> CuResult<u32> {
            if !o.functions.contains_key(&h(f)) && !o.kernels.contains_key(&h(f)) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            let c = context::current(o, sim)?;
            Ok(sim.cfg.devices[context::device_of(o, c)?.1].sms)
        })?;
        out(n, (sms * per_sm / size) as i32)
    }

    /// The largest portable cluster (8 blocks), as on an H100.
    fn cuOccupancyMaxPotentialClusterSize(n: *mut i32, f: Handle, config: *const LaunchConfig) {
        cuda()?;
        cluster_config(config)?;
        with(|o| o.functions.contains_key(&h(f)) || o.kernels.contains_key(&h(f)))
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(n, 8)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        n: *mut i32,
        f: Handle,
        block: i32,
        dyn_smem: usize,
        flags: u32,
    ) {
        cuda()?;
        if block <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(n, (2048 / block).clamp(1, 32))
    }
}

alias! {
    cuLaunchKernel_ptsz => cuLaunchKernel(
        f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, s: Handle,
        params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(
        config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(
        f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, s: Handle,
        params: *mut *mut c_void);
}
