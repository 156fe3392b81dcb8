//! Modules, libraries, functions and kernels, and the module image format that gives kernels a speed.
//!
//! A text image starting with `CUDASIM-MODULE 1` declares its kernels (`kernel <name> <ns_per_wave>
//! [<local_bytes>]`: local memory per thread, `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`; a launch of a kernel whose
//! local memory exceeds the context's stack size grows the stack to it, for every thread the device holds, as a
//! real driver does) and optionally globals (`global <name> <bytes>`); asking for any other name is CUDA_ERROR_NOT_FOUND. A
//! compiled image (fat binary or its wrapper, cubin, PTX: see `code`) defines the kernels and globals its code
//! for the device defines; its kernels run at CUDASIM_WAVE_NS, its globals are allocated (with their initial
//! bytes) at their first lookup, a library's when it loads into a context. Any other image loads as an opaque module whose every kernel name exists.
//! Each module (and each context a library is loaded into) costs CUDASIM_MODULE_OVERHEAD bytes of device
//! memory. Libraries (cuLibrary*) are context-independent: they load into a context when first used in it
//! (lazy loading, CUDA's default), or with CUDA_MODULE_LOADING=EAGER into the one current at load time.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

use crate::code::Code;
use crate::memory::AllocKind;
use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

/// What a module image declares.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Image {
    /// Kernel name → ns per wave.
    pub kernels: Vec<(String, u64)>,
    /// Global name → bytes.
    pub globals: Vec<(String, u64)>,
    /// Kernel name → local memory per thread (bytes), when declared.
    pub locals: Vec<(String, u64)>,
    /// Kernel name → what it does to memory (`touch` lines, in order).
    pub touches: Vec<(String, crate::touch::Op)>,
    /// Kernel name → the parameter whose value (64 bits, when not 0) is its ns per wave (`length` lines): a
    /// data-dependent kernel, one launch shape of several lengths.
    pub lengths: Vec<(String, usize)>,
    /// Neither a CUDASIM-MODULE text image nor compiled code: every kernel name exists.
    pub opaque: bool,
    /// Compiled code: names come from it (unreadable code behaves as opaque).
    pub code: Option<Code>,
}

impl Image {
    /// CUDA_ERROR_NO_BINARY_FOR_GPU for compiled code without code for this GPU.
    pub(crate) fn runs_here(&self) -> CuResult<()> {
        self.code.as_ref().map_or(Ok(()), Code::runs_here)
    }

    /// Whether kernel `name` exists (Ok(None): not found), and its ns per wave.
    fn kernel(&self, name: &str, wave_ns: u64) -> CuResult<Option<u64>> {
        self.runs_here()?;
        Ok(self.kernel_in_code(name, wave_ns))
    }

    fn kernel_in_code(&self, name: &str, wave_ns: u64) -> Option<u64> {
        if let Some(k) = self.kernels.iter().find(|k| k.0 == name) {
            return Some(k.1);
        }
        match self.code.as_ref().and_then(Code::symbols) {
            Some(s) => s.kernels.contains(name).then_some(wave_ns),
            None => (self.opaque || self.code.is_some()).then_some(wave_ns),
        }
    }

    /// Local memory per thread of kernel `name` (0 unless declared).
    pub(crate) fn local(&self, name: &str) -> u64 {
        self.locals.iter().find(|k| k.0 == name).map_or(0, |k| k.1)
    }

    /// How many kernels the image defines (0 for an opaque one).
    pub(crate) fn kernel_count(&self) -> usize {
        match self.code.as_ref().and_then(Code::symbols) {
            Some(s) => s.kernels.len(),
            None => self.kernels.len(),
        }
    }
}

const TEXT_MAGIC: &[u8] = b"CUDASIM-MODULE 1";

/// Parses a CUDASIM-MODULE text image. Errors name the bad line.
pub(crate) fn parse_text(text: &str) -> Result<Image, String> {
    let mut img = Image::default();
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some("CUDASIM-MODULE 1") {
        return Err("first line must be `CUDASIM-MODULE 1`".into());
    }
    for (n, line) in lines.enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("line {}: bad number {s:?}", n + 2))
        };
        match f.as_slice() {
            ["kernel", name, ns] => img.kernels.push((name.to_string(), num(ns)?)),
            ["kernel", name, ns, local] => {
                img.kernels.push((name.to_string(), num(ns)?));
                img.locals.push((name.to_string(), num(local)?));
            }
            ["global", name, bytes] => img.globals.push((name.to_string(), num(bytes)?)),
            ["length", name, p] => {
                let i = p.strip_prefix('p').and_then(|i| i.parse::<usize>().ok());
                match i {
                    Some(i) if img.kernels.iter().any(|k| k.0 == *name) => {
                        img.lengths.push((name.to_string(), i))
                    }
                    _ => {
                        return Err(format!(
                            "line {}: expected `length <declared kernel> p<I>`",
                            n + 2
                        ))
                    }
                }
            }
            ["touch", name, op @ ..] => {
                if !img.kernels.iter().any(|k| k.0 == *name) {
                    return Err(format!("line {}: touch of undeclared kernel {name:?}", n + 2));
                }
                let op = crate::touch::parse(op).map_err(|e| format!("line {}: {e}", n + 2))?;
                img.touches.push((name.to_string(), op));
            }
            _ => {
                return Err(format!(
                    "line {}: expected `kernel <name> <ns_per_wave>`: {line:?}",
                    n + 2
                ))
            }
        }
    }
    Ok(img)
}

/// An image of compiled code, or an opaque one.
fn compiled(code: Option<Code>) -> Image {
    Image {
        opaque: code.is_none(),
        code,
        ..Image::default()
    }
}

/// Reads an image from memory: a NUL-terminated CUDASIM-MODULE text, compiled code, or anything else
/// (opaque).
///
/// # Safety
/// `p` must point to a module image as cuModuleLoadData requires (readable at least up to the first byte
/// that differs from the text magic, or to a NUL-terminated string when it is text; a compiled image
/// complete in memory).
pub(crate) unsafe fn read_image(p: *const c_void) -> CuResult<Image> {
    // SAFETY: forwarded contract.
    let image = unsafe { read_image_now(p) };
    loaded_signal();
    image
}

/// `CUDASIM_LOADED_SIGNAL=N`: once an image was read from the program's memory, signal N is raised in the
/// calling thread before the load returns (a test's hook: its handler changes the image after the driver read
/// it, deterministically, where a racing thread would only sometimes).
fn loaded_signal() {
    if let Some(n) = std::env::var("CUDASIM_LOADED_SIGNAL")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        // SAFETY: raising a signal in this thread; the program installed its handler.
        unsafe { libc::raise(n) };
    }
}

/// # Safety
/// As [`read_image`].
unsafe fn read_image_now(p: *const c_void) -> CuResult<Image> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let b = p as *const u8;
    for (i, &m) in TEXT_MAGIC.iter().enumerate() {
        // SAFETY: reading stops at the first byte that differs from the magic (per the contract above).
        if unsafe { *b.add(i) } != m {
            // SAFETY: forwarded contract: a compiled image is complete in memory.
            return Ok(compiled(unsafe { crate::code::read(b) }?));
        }
    }
    // SAFETY: a text image is NUL-terminated.
    let text = unsafe { CStr::from_ptr(p as *const libc::c_char) }.to_string_lossy();
    parse_text(&text).map_err(|e| {
        eprintln!("cudasim: invalid CUDASIM-MODULE image: {e}");
        CUDA_ERROR_INVALID_IMAGE
    })
}

/// Reads an image file (cuModuleLoad, cuLibraryLoadFromFile).
pub(crate) fn read_image_file(path: &str) -> CuResult<Image> {
    let data = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if data.starts_with(TEXT_MAGIC) {
        parse_text(&String::from_utf8_lossy(&data)).map_err(|_| CUDA_ERROR_INVALID_IMAGE)
    } else {
        crate::code::read_bytes(&data).map(compiled)
    }
}

/// A module loaded in a context.
pub(crate) struct Module {
    pub ctx: u64,
    pub phys: usize,
    pub image: Arc<Image>,
    /// Name → function handle (one handle per name, as on a real driver).
    pub functions: HashMap<String, u64>,
    /// Name → (device pointer, bytes).
    pub globals: HashMap<String, (u64, u64)>,
    /// Owned by a library (unloaded with it, not by cuModuleUnload).
    pub library: Option<u64>,
}

/// A function (CUfunction).
pub(crate) struct Function {
    pub module: u64,
    pub name: String,
    pub ns_per_wave: u64,
    /// Local memory per thread (bytes).
    pub local: u64,
    /// What the kernel does to memory (`touch`), in order.
    pub touch: Vec<crate::touch::Op>,
    /// The parameter that gives its ns per wave (`length`), if any.
    pub length: Option<usize>,
    /// cuFuncSetBlockShape / cuFuncSetSharedSize state for the legacy cuLaunch* calls.
    pub block: [u32; 3],
    pub shared: u32,
    pub max_dynamic_shared: i32,
}

/// A library (CUlibrary).
pub(crate) struct Library {
    pub image: Arc<Image>,
    /// Context → module the library is loaded as there.
    pub modules: HashMap<u64, u64>,
    /// Name → kernel handle.
    pub kernels: HashMap<String, u64>,
}

/// A kernel (CUkernel): a name in a library, independent of contexts.
pub(crate) struct Kernel {
    pub library: u64,
    pub name: String,
}

/// Loads `image` into context `ctx`: charges the overhead and allocates the globals.
pub(crate) fn load(
    o: &mut Objects,
    sim: &Sim,
    ctx: u64,
    image: Arc<Image>,
    library: Option<u64>,
) -> CuResult<u64> {
    let (_, phys) = crate::context::device_of(o, ctx)?;
    sim.charge(phys, sim.cfg.module_overhead)?;
    let h = new_handle(Kind::Module);
    let mut globals = HashMap::new();
    let mut all: Vec<(&str, u64, &[u8])> = image
        .globals
        .iter()
        .map(|(n, b)| (n.as_str(), *b, &[][..]))
        .collect();
    // A library loads into a context at its first use there (lazy loading), its compiled code's globals with
    // it, whatever name is asked for (a kernel's launch, a graph's included); a module's at their lookup.
    if library.is_some() {
        if let Some(sym) = image.code.as_ref().and_then(Code::symbols) {
            all.extend(sym.globals.iter().map(|(n, g)| (n.as_str(), g.size, &g.init[..])));
        }
    }
    for (name, bytes, init) in all {
        match crate::memory::alloc(o, sim, ctx, bytes.max(1), AllocKind::ModuleGlobal, false) {
            Ok(p) => {
                // SAFETY: `p` is a fresh allocation of at least `bytes` ≥ init.len() bytes, backed by host memory.
                unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), p as *mut u8, init.len()) };
                globals.insert(name.to_string(), (p, bytes));
            }
            Err(e) => {
                free_globals(o, sim, globals.values().map(|g| g.0));
                sim.uncharge(phys, sim.cfg.module_overhead);
                return Err(e);
            }
        }
    }
    o.modules.insert(
        h,
        Module {
            ctx,
            phys,
            image,
            functions: HashMap::new(),
            globals,
            library,
        },
    );
    Ok(h)
}

fn free_globals(o: &mut Objects, sim: &Sim, ptrs: impl Iterator<Item = u64>) {
    let ptrs: Vec<u64> = ptrs.collect();
    for p in ptrs {
        if let Some(a) = o.mem.allocs.remove(&p) {
            o.mem.give_range(a.phys, p, a.len);
            sim.uncharge(a.phys, a.len);
        }
    }
}

/// Unloads a module: its functions, globals and overhead.
pub(crate) fn unload(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    let m = o.modules.remove(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for f in m.functions.values() {
        o.functions.remove(f);
    }
    free_globals(o, sim, m.globals.values().map(|g| g.0));
    sim.uncharge(m.phys, sim.cfg.module_overhead);
    if let Some(lib) = m.library.and_then(|l| o.libraries.get_mut(&l)) {
        lib.modules.retain(|_, &mut mh| mh != h);
    }
    Ok(())
}

/// Unloads the modules of a context being torn down.
pub(crate) fn destroy_for_context(o: &mut Objects, sim: &Sim, ctx: u64) {
    let mine: Vec<u64> = o
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(&h, _)| h)
        .collect();
    for h in mine {
        let _ = unload(o, sim, h);
    }
}

/// cuModuleGetFunction.
pub(crate) fn get_function(o: &mut Objects, sim: &Sim, module: u64, name: &str) -> CuResult<u64> {
    let m = o.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(&f) = m.functions.get(name) {
        return Ok(f);
    }
    let ns = m
        .image
        .kernel(name, sim.cfg.wave_ns)?
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let local = m.image.local(name);
    let touch = m
        .image
        .touches
        .iter()
        .filter(|t| t.0 == name)
        .map(|t| t.1)
        .collect();
    let length = m.image.lengths.iter().find(|l| l.0 == name).map(|l| l.1);
    let f = new_handle(Kind::Function);
    o.functions.insert(
        f,
        Function {
            module,
            name: name.to_string(),
            ns_per_wave: ns,
            local,
            touch,
            length,
            block: [1, 1, 1],
            shared: 0,
            max_dynamic_shared: 0,
        },
    );
    o.modules
        .get_mut(&module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .functions
        .insert(name.to_string(), f);
    Ok(f)
}

/// cuModuleGetGlobal: a declared global of a text image, or a global of compiled code (allocated in the
/// module's context at its first lookup, holding the image's initial bytes).
pub(crate) fn get_global(o: &mut Objects, sim: &Sim, module: u64, name: &str) -> CuResult<(u64, u64)> {
    let m = o.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(&g) = m.globals.get(name) {
        return Ok(g);
    }
    let (ctx, image) = (m.ctx, m.image.clone());
    image.runs_here()?;
    let g = image
        .code
        .as_ref()
        .and_then(Code::symbols)
        .and_then(|s| s.globals.get(name))
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let p = crate::memory::alloc(o, sim, ctx, g.size.max(1), AllocKind::ModuleGlobal, false)?;
    // SAFETY: `p` is a fresh allocation of at least `size` ≥ init.len() bytes, backed by host memory.
    unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p as *mut u8, g.init.len()) };
    o.modules
        .get_mut(&module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .globals
        .insert(name.to_string(), (p, g.size));
    Ok((p, g.size))
}

/// Whether libraries load into the current context at cuLibraryLoad* (`CUDA_MODULE_LOADING=EAGER`) rather than
/// into each context at their first use there (lazy loading, CUDA's default since 12.2). Read per process,
/// as the driver does.
fn eager_loading() -> bool {
    static EAGER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EAGER.get_or_init(|| std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER")))
}

/// cuLibraryLoadData: with eager loading, loads into the current context if there is one; lazily, into each
/// context at its first use there (cuBLAS loads ~1000 fat binaries and uses a few: charging each its module
/// overhead at load would take gigabytes no real GPU spends).
pub(crate) fn library_load(o: &mut Objects, sim: &Sim, image: Image) -> CuResult<u64> {
    let h = new_handle(Kind::Library);
    o.libraries.insert(
        h,
        Library {
            image: Arc::new(image),
            modules: HashMap::new(),
            kernels: HashMap::new(),
        },
    );
    if eager_loading() && crate::context::current_handle() != 0 {
        if let Ok(ctx) = crate::context::current(o, sim) {
            if let Err(e) = library_module(o, sim, h, ctx) {
                o.libraries.remove(&h);
                return Err(e);
            }
        }
    }
    Ok(h)
}

/// The module library `lib` is in context `ctx` (loading it there on first use).
pub(crate) fn library_module(o: &mut Objects, sim: &Sim, lib: u64, ctx: u64) -> CuResult<u64> {
    let l = o.libraries.get(&lib).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(&m) = l.modules.get(&ctx) {
        return Ok(m);
    }
    let image = l.image.clone();
    let m = load(o, sim, ctx, image, Some(lib))?;
    o.libraries
        .get_mut(&lib)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .modules
        .insert(ctx, m);
    Ok(m)
}

/// cuLibraryUnload: unloads it from every context.
pub(crate) fn library_unload(o: &mut Objects, sim: &Sim, lib: u64) -> CuResult<()> {
    let l = o.libraries.remove(&lib).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for m in l.modules.values() {
        let _ = unload(o, sim, *m);
    }
    for k in l.kernels.values() {
        o.kernels.remove(k);
    }
    Ok(())
}

/// cuLibraryGetKernel.
pub(crate) fn library_get_kernel(o: &mut Objects, lib: u64, name: &str) -> CuResult<u64> {
    let l = o.libraries.get(&lib).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(&k) = l.kernels.get(name) {
        return Ok(k);
    }
    // Compiled code is read only when a kernel is used in a context (cuKernelGetFunction, a launch): the CUDA
    // runtime asks for a handle to every kernel of every fat binary it registers, and reading them all
    // would cost a framework seconds at start-up.
    if l.image.code.is_some() {
        l.image.runs_here()?;
    } else if l.image.kernel(name, 0)?.is_none() {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    let k = new_handle(Kind::Kernel);
    o.kernels.insert(
        k,
        Kernel {
            library: lib,
            name: name.to_string(),
        },
    );
    o.libraries
        .get_mut(&lib)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .kernels
        .insert(name.to_string(), k);
    Ok(k)
}

/// The function a launch handle means in context `ctx`: a CUfunction, or a CUkernel (which static cudart 12+
/// passes to cuLaunchKernel) resolved in that context. Returns (function handle, ns per wave).
pub(crate) fn function_for(o: &mut Objects, sim: &Sim, f: u64, ctx: u64) -> CuResult<(u64, u64)> {
    if let Some(func) = o.functions.get(&f) {
        return Ok((f, func.ns_per_wave));
    }
    let k = o.kernels.get(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (lib, name) = (k.library, k.name.clone());
    let m = library_module(o, sim, lib, ctx)?;
    let func = get_function(o, sim, m, &name)?;
    Ok((func, o.functions[&func].ns_per_wave))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_images() {
        let img = parse_text("CUDASIM-MODULE 1\nkernel spin 1000\n# comment\n\nkernel fast 0\nglobal g 64\n")
            .unwrap();
        assert_eq!(img.kernels, vec![("spin".into(), 1000), ("fast".into(), 0)]);
        assert_eq!(img.globals, vec![("g".into(), 64)]);
        assert!(!img.opaque);
        assert!(parse_text("CUDASIM-MODULE 2\n").is_err());
        assert!(parse_text("CUDASIM-MODULE 1\nkernel x\n").is_err());
        assert!(parse_text("CUDASIM-MODULE 1\nkernel x fast\n").is_err());
    }

    #[test]
    fn image_from_memory() {
        let text = b"CUDASIM-MODULE 1\nkernel k 5\n\0";
        // SAFETY: a NUL-terminated text image.
        let img = unsafe { read_image(text.as_ptr() as *const c_void) }.unwrap();
        assert_eq!(img.kernels, vec![("k".into(), 5)]);
        // A fat-binary wrapper without code for this GPU: the driver's error.
        let wrapper: [u8; 24] = [
            0xb1, 0x43, 0x62, 0x46, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        // SAFETY: a complete (empty) wrapper.
        let img = unsafe { read_image(wrapper.as_ptr() as *const c_void) }.unwrap();
        assert_eq!(img.runs_here(), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        assert_eq!(img.kernel("k", 7), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        // An unknown format: opaque, every kernel name exists.
        let other: [u8; 16] = [0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        // SAFETY: 16 readable bytes that differ from every magic and are not text.
        let img = unsafe { read_image(other.as_ptr() as *const c_void) }.unwrap();
        assert!(img.opaque);
        assert_eq!(img.kernel("anything", 7), Ok(Some(7)));
    }
}
