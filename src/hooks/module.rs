//! Module and library loads: the image a load hands the driver is read for its footprint (`memory::image`),
//! from our own copy under a memory cap (`image_copy`); the load is admitted as a creation
//! (`OverheadCall::Load`): an estimate reserved before the call, the cost measured after it, a module that does
//! not fit unloaded and refused with `CUDA_ERROR_OUT_OF_MEMORY`.

use super::image_copy::{self, ImageCopy};
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::OverheadCall;
use crate::state::Shim;

/// The image a load hands the driver, read for its footprint (`memory::image`) once the driver accepted it.
#[derive(Clone, Copy)]
pub(crate) enum ImageAt {
    /// In memory (`cuModuleLoadData`, `…Ex`, `cuModuleLoadFatBinary`, `cuLibraryLoadData`).
    Memory(*const std::ffi::c_void),
    /// A file's contents, read once by us and handed to the driver as they are (`cuModuleLoad`,
    /// `cuLibraryLoadFromFile`: see [`read_image_file`]).
    Bytes(*const u8, usize),
    /// Read before the call from our own copy, which the driver was handed (`image_copy`).
    Known(Option<u64>),
}

impl ImageAt {
    /// Compressed fat-binary entries are decompressed only while a memory cap may apply (a cap set later meets
    /// them as images of unknown footprint: measured after their first use).
    ///
    /// # Safety
    /// The image is one the driver just loaded (complete in memory, or `len` readable bytes).
    unsafe fn footprint(self, s: &Shim, arch: Option<u32>) -> Option<u64> {
        s.devices.refresh_if_changed();
        let inflate = s.devices.memory_limited();
        match self {
            // SAFETY: the caller's contract.
            ImageAt::Memory(p) => unsafe { crate::memory::image_footprint_at(p.cast(), inflate, arch) },
            ImageAt::Bytes(p, n) => {
                // SAFETY: `n` readable bytes at `p` (the caller's contract).
                let data = unsafe { std::slice::from_raw_parts(p, n) };
                crate::memory::image_footprint(data, inflate, arch)
            }
            ImageAt::Known(f) => f,
        }
    }
}

/// The compute capability (`major * 10 + minor`) of the current context's device: a module's image is read
/// for the entries the driver could load there. `None` when the driver will not say (every entry counts).
/// Libraries are loaded into every context lazily: their images are read whole (`None`).
fn module_arch(s: &Shim) -> Option<u32> {
    let d = s.devices.current(&s.cuda)?;
    let attr = |a| {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: valid out-pointer.
        let ok = unsafe { s.cuda.cuDeviceGetAttribute(&mut n, a, d.ordinal) }.ok();
        (ok && (0..100).contains(&n)).then_some(n as u32)
    };
    Some(
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? * 10
            + attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    )
}

/// A module or library file's contents, read once: the driver is handed these very bytes from memory, so what
/// it loads is what the footprint was read from (reading the file again after the driver did would let a
/// program swap it in between, and would wait forever on a FIFO or a pipe written once). Followed by 8 NULs
/// (PTX text ends at a NUL). `Err`: the driver's answer for it (unreadable: not found; a binary format whose
/// headers point past the file: an invalid image, never read past our copy).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn read_image_file(path: *const std::ffi::c_char) -> Result<(Vec<u8>, usize), CUresult> {
    if path.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes());
    let mut data = std::fs::read(path).map_err(|_| CUresult::ERROR_FILE_NOT_FOUND)?;
    if !crate::memory::image_inside(&data) {
        return Err(CUresult::ERROR_INVALID_IMAGE);
    }
    let len = data.len();
    data.extend_from_slice(&[0; 8]);
    Ok((data, len))
}

/// `cuModuleLoad`: the file read once ([`read_image_file`]) and loaded with `cuModuleLoadData`.
///
/// # Safety
/// As `cuModuleLoad` requires.
pub(crate) unsafe fn module_load_file(
    s: &Shim,
    _call: impl FnOnce() -> CUresult,
    module: *mut CUmodule,
    fname: *const std::ffi::c_char,
) -> CUresult {
    // SAFETY: the caller's contract.
    let (data, len) = match unsafe { read_image_file(fname) } {
        Ok(d) => d,
        Err(r) => return r,
    };
    let p = data.as_ptr();
    // SAFETY: `data` outlives the call (the driver copies a module's image); `module` is the program's.
    unsafe {
        module_load(
            s,
            || s.cuda.cuModuleLoadData(module, p.cast()),
            module,
            ImageAt::Bytes(p, len),
        )
    }
}

/// `cuLibraryLoadFromFile`: the file read once ([`read_image_file`]) and loaded with `cuLibraryLoadData` and the
/// same options (our copy of them). `CU_LIBRARY_BINARY_IS_PRESERVED` is refused, as the driver refuses it for
/// a file, so the driver keeps its own copy and ours is freed after the call.
///
/// # Safety
/// As `cuLibraryLoadFromFile` requires.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_file(
    s: &Shim,
    _call: impl FnOnce() -> CUresult,
    library: *mut CUlibrary,
    file: *const std::ffi::c_char,
    jit_options: *mut CUjit_option,
    jit_values: *mut *mut std::ffi::c_void,
    n_jit: std::ffi::c_uint,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut *mut std::ffi::c_void,
    n_lib: std::ffi::c_uint,
) -> CUresult {
    // SAFETY: the caller's contract.
    let (data, len) = match unsafe { read_image_file(file) } {
        Ok(d) => d,
        Err(r) => return r,
    };
    // SAFETY: the caller's contract.
    let (mut o, mut v, preserved) = match unsafe { library_options(lib_options, lib_values, n_lib) } {
        Ok(x) => x,
        Err(r) => return r,
    };
    if preserved {
        return CUresult::ERROR_INVALID_VALUE; // the driver's answer for a file (cuda.h)
    }
    let p = data.as_ptr();
    // SAFETY: `data` outlives the call (not preserved: the driver keeps its own copy); the options are our copy
    // of the program's.
    unsafe {
        library_load(
            s,
            || {
                s.cuda.cuLibraryLoadData(
                    library,
                    p.cast(),
                    jit_options,
                    jit_values,
                    n_jit,
                    or_null(&mut o),
                    or_null(&mut v),
                    n_lib,
                )
            },
            library,
            ImageAt::Bytes(p, len),
        )
    }
}

/// `CUlibraryOption`: the driver may read `code` until `cuLibraryUnload` instead of copying it (cuda.h).
const CU_LIBRARY_BINARY_IS_PRESERVED: CUlibraryOption = 1;

/// Our copies of images the driver may read until their library is unloaded (`CU_LIBRARY_BINARY_IS_PRESERVED`),
/// by library handle.
static PRESERVED: parking_lot::Mutex<Vec<(usize, ImageCopy)>> = parking_lot::Mutex::new(Vec::new());

/// The program's library options copied (the driver is handed ours: what it acts on is what we read), and
/// whether `CU_LIBRARY_BINARY_IS_PRESERVED` is among them. More than 16 (there are 2) or NULL arrays:
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `n` entries at `o` and `v` when not NULL.
#[allow(clippy::type_complexity)]
unsafe fn library_options(
    o: *mut CUlibraryOption,
    v: *mut *mut std::ffi::c_void,
    n: std::ffi::c_uint,
) -> Result<(Vec<CUlibraryOption>, Vec<*mut std::ffi::c_void>, bool), CUresult> {
    if n == 0 {
        return Ok((Vec::new(), Vec::new(), false));
    }
    if n > 16 || o.is_null() || v.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let (o, v) = unsafe {
        (
            std::slice::from_raw_parts(o, n as usize).to_vec(),
            std::slice::from_raw_parts(v, n as usize).to_vec(),
        )
    };
    let preserved = o.contains(&CU_LIBRARY_BINARY_IS_PRESERVED);
    Ok((o, v, preserved))
}

fn or_null<T>(v: &mut [T]) -> *mut T {
    if v.is_empty() {
        std::ptr::null_mut()
    } else {
        v.as_mut_ptr()
    }
}

/// Whether a memory cap applies to a device of this process: only then are in-memory images copied.
fn capped(s: &Shim) -> bool {
    s.devices.known().any(|(d, _)| s.devices.memory_cap(d).is_some())
}

/// Our copy of an in-memory image (`image_copy`); `None`: refused, logged.
///
/// # Safety
/// `image` as the load calls require.
unsafe fn copied(image: *const std::ffi::c_void) -> Option<ImageCopy> {
    // SAFETY: the caller's contract.
    let c = unsafe { image_copy::copy(image) };
    if c.is_none() {
        log!(
            Level::Error,
            "image at {image:p} refused: its extent cannot be read from its headers (or passes 4 GiB), so what \
             it loads cannot be admitted under the memory cap"
        );
    }
    c
}

/// `cuModuleLoadData`, `…Ex` (with the program's options: `with` is the real call given an image),
/// `cuModuleLoadFatBinary`. Under a memory cap the driver is handed our copy of the image, whose footprint is
/// read before the call (another thread rewriting the program's image meanwhile changes neither); freed after
/// the call (the driver keeps its own). Without a cap the program's image as it is, no copy.
///
/// # Safety
/// As those calls require.
pub(crate) unsafe fn module_load_data(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    with: impl FnOnce(*const std::ffi::c_void) -> CUresult,
    module: *mut CUmodule,
    image: *const std::ffi::c_void,
) -> CUresult {
    if image.is_null() || !capped(s) {
        // SAFETY: the caller's contract.
        return unsafe { module_load(s, call, module, ImageAt::Memory(image)) };
    }
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { copied(image) }) else {
        return CUresult::ERROR_INVALID_IMAGE;
    };
    let fp = c.footprint(module_arch(s));
    // SAFETY: `c` outlives the call; `module` is the program's.
    unsafe { module_load(s, || with(c.ptr()), module, ImageAt::Known(fp)) }
}

/// `cuLibraryLoadData` (`with`: the real call given an image and library options). Under a memory cap as
/// [`module_load_data`], with our copy of the library options; a copy the driver may keep reading
/// (`CU_LIBRARY_BINARY_IS_PRESERVED`) lives until the library's `cuLibraryUnload`.
///
/// # Safety
/// As `cuLibraryLoadData` requires.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn library_load_data(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    with: impl FnOnce(
        *const std::ffi::c_void,
        *mut CUlibraryOption,
        *mut *mut std::ffi::c_void,
        std::ffi::c_uint,
    ) -> CUresult,
    library: *mut CUlibrary,
    code: *const std::ffi::c_void,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut *mut std::ffi::c_void,
    n_lib: std::ffi::c_uint,
) -> CUresult {
    if code.is_null() || !capped(s) {
        // SAFETY: the caller's contract.
        return unsafe { library_load(s, call, library, ImageAt::Memory(code)) };
    }
    // SAFETY: the caller's contract.
    let (mut o, mut v, preserved) = match unsafe { library_options(lib_options, lib_values, n_lib) } {
        Ok(x) => x,
        Err(r) => return r,
    };
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { copied(code) }) else {
        return CUresult::ERROR_INVALID_IMAGE;
    };
    let (fp, p) = (c.footprint(None), c.ptr());
    // SAFETY: `c` outlives the call (kept until unload when preserved); `library` is the program's.
    let r = unsafe {
        library_load(
            s,
            || with(p, or_null(&mut o), or_null(&mut v), n_lib),
            library,
            ImageAt::Known(fp),
        )
    };
    if r.ok() && preserved && !library.is_null() {
        // SAFETY: written by the driver on success.
        PRESERVED.lock().push((unsafe { *library } as usize, c));
    }
    r
}

/// `cuModuleLoad`, `cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`.
///
/// # Safety
/// `module` as the driver's contract says (written on success).
pub(crate) unsafe fn module_load(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    module: *mut CUmodule,
    image: ImageAt,
) -> CUresult {
    // SAFETY: written by the driver on success (read only then, and only when not NULL).
    let out = || (!module.is_null()).then(|| unsafe { *module } as usize);
    // SAFETY: read once the driver accepted the image (the caller's contract).
    let footprint = || unsafe { image.footprint(s, module_arch(s)) };
    let load = OverheadCall::Load {
        library: false,
        out: &out,
        footprint: &footprint,
    };
    s.mem.overhead().call(&s.cuda, &s.nvml, load, call)
}

/// `cuModuleUnload`.
pub(crate) fn module_unload(s: &Shim, call: impl FnOnce() -> CUresult, hmod: CUmodule) -> CUresult {
    let unload = OverheadCall::Unload {
        library: false,
        handle: hmod as usize,
    };
    s.mem.overhead().call(&s.cuda, &s.nvml, unload, call)
}

/// `cuLibraryLoadData`, `cuLibraryLoadFromFile`.
///
/// # Safety
/// `library` as the driver's contract says (written on success).
pub(crate) unsafe fn library_load(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    library: *mut CUlibrary,
    image: ImageAt,
) -> CUresult {
    // SAFETY: written by the driver on success (read only then, and only when not NULL).
    let out = || (!library.is_null()).then(|| unsafe { *library } as usize);
    // SAFETY: read once the driver accepted the image (the caller's contract).
    let footprint = || unsafe { image.footprint(s, None) };
    let load = OverheadCall::Load {
        library: true,
        out: &out,
        footprint: &footprint,
    };
    s.mem.overhead().call(&s.cuda, &s.nvml, load, call)
}

/// `cuLibraryUnload`.
pub(crate) fn library_unload(s: &Shim, call: impl FnOnce() -> CUresult, library: CUlibrary) -> CUresult {
    let unload = OverheadCall::Unload {
        library: true,
        handle: library as usize,
    };
    let r = s.mem.overhead().call(&s.cuda, &s.nvml, unload, call);
    if r.ok() {
        let mut kept = PRESERVED.lock();
        if let Some(i) = kept.iter().position(|(l, _)| *l == library as usize) {
            drop(kept.swap_remove(i));
        }
    }
    r
}
