//! Compiled module images: fat binaries, cubins (ELF) and PTX, as nvcc, NVRTC and NVIDIA's libraries hand
//! them to cuModuleLoadData / cuLibraryLoadData.
//!
//! The simulator runs no device code, but it answers the questions a driver answers from the image: which
//! kernels exist (cuModuleGetFunction / cuLibraryGetKernel of any other name is CUDA_ERROR_NOT_FOUND) and which
//! globals exist with what size and initial bytes (cuModuleGetGlobal, which libraries such as cuBLAS use to
//! reach their `__device__` tables). A fat binary holds one entry per architecture: the driver takes the cubin
//! built for the device (same major version, the highest minor not above the device's: sm_90 and sm_90a on the
//! simulated H100), else PTX for an architecture not above the device's (which it would JIT-compile), else
//! there is no code for this GPU: cuModuleLoadData fails with CUDA_ERROR_NO_BINARY_FOR_GPU, while a library
//! (cuLibraryLoadData, loaded lazily by the driver) loads and fails only when a kernel or global is asked
//! for — cuBLAS loads every fat binary it has, including those built only for newer GPUs. Entries may be
//! LZ4- or Zstandard-compressed.
//!
//! Loading copies the chosen entries (the caller may free its image afterwards); decompressing and reading
//! the symbols happens once, at the first name lookup, so that a framework registering hundreds of fat
//! binaries at start-up pays only for the ones it uses (the driver's lazy loading does the same).
//!
//! Layout facts (public descriptions, e.g. ZLUDA's `dark_api` fatbin notes; the ELF layout is the System V
//! ABI's): fatbin wrapper `{u32 magic 0x466243B1, u32 version, data, prelinked}`; fatbin header
//! `{u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 files_size}`; each entry
//! `{u16 kind (1 PTX, 2 ELF), u16 version, u32 header_size, u32 payload_size, u32 _, u32 compressed_size,
//! u32 _, u32 _, u32 sm, u32 _, u32 _, u64 flags (0x2000 LZ4, 0x8000 Zstandard), u64 _, u64 uncompressed}`.
//! In a cubin, kernels are function symbols marked STO_CUDA_ENTRY (st_other 0x10); globals are object symbols
//! in the `.nv.global*` and `.nv.constant*` sections.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use crate::types::*;

const WRAPPER_MAGIC: u32 = 0x466243B1;
const FATBIN_MAGIC: u32 = 0xBA55ED50;
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// The simulated device's architecture (compute capability 9.0, see device.rs).
const DEVICE_SM: u32 = 90;
/// No entry of a real library decompresses to more than this (a bound against corrupt sizes).
const MAX_UNCOMPRESSED: u64 = 1 << 30;
/// Kernels are `.entry` functions: st_other bit STO_CUDA_ENTRY.
const STO_CUDA_ENTRY: u8 = 0x10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Elf,
    Ptx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Lz4,
    Zstd,
}

/// One entry of the device's code, copied from the caller's image.
struct Piece {
    format: Format,
    compression: Compression,
    uncompressed: u64,
    bytes: Vec<u8>,
}

/// A global variable of a compiled image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Global {
    pub size: u64,
    /// Initial bytes (at most `size`; the rest is zero).
    pub init: Vec<u8>,
}

/// What the device's code of an image defines.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    pub kernels: HashSet<String>,
    pub globals: HashMap<String, Global>,
}

/// A compiled image: the entries the device would run, read on first use.
pub(crate) struct Code {
    /// Empty when the image has no code for this GPU.
    pieces: Vec<Piece>,
    symbols: OnceLock<Option<Symbols>>,
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Code({} pieces)", self.pieces.len())
    }
}

impl PartialEq for Code {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for Code {}

impl Code {
    /// Whether the image holds code this GPU can run (else CUDA_ERROR_NO_BINARY_FOR_GPU).
    pub(crate) fn runs_here(&self) -> CuResult<()> {
        if self.pieces.is_empty() {
            return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
        }
        Ok(())
    }

    /// The image's symbols; `None` when the code cannot be read (reported once on stderr: the module then
    /// behaves as an opaque one whose every name exists).
    pub(crate) fn symbols(&self) -> Option<&Symbols> {
        self.symbols
            .get_or_init(|| match self.read_symbols() {
                Ok(s) => Some(s),
                Err(why) => {
                    eprintln!("cudasim: cannot read a module image ({why}): its kernel and global names are not checked");
                    None
                }
            })
            .as_ref()
    }

    fn read_symbols(&self) -> Result<Symbols, String> {
        let mut all = Symbols::default();
        for p in &self.pieces {
            let bytes = decompress(p)?;
            let s = match p.format {
                Format::Elf => elf_symbols(&bytes)?,
                Format::Ptx => ptx_symbols(&String::from_utf8_lossy(&bytes)),
            };
            all.kernels.extend(s.kernels);
            all.globals.extend(s.globals);
        }
        Ok(all)
    }
}

fn decompress(p: &Piece) -> Result<Vec<u8>, String> {
    if p.uncompressed > MAX_UNCOMPRESSED {
        return Err(format!("entry claims {} bytes uncompressed", p.uncompressed));
    }
    match p.compression {
        Compression::None => Ok(p.bytes.clone()),
        Compression::Lz4 => {
            lz4_flex::block::decompress(&p.bytes, p.uncompressed as usize).map_err(|e| format!("LZ4: {e}"))
        }
        Compression::Zstd => {
            let mut out = Vec::with_capacity(p.uncompressed as usize);
            let mut dec = ruzstd::decoding::StreamingDecoder::new(&p.bytes[..])
                .map_err(|e| format!("Zstandard: {e}"))?;
            std::io::Read::read_to_end(&mut dec, &mut out).map_err(|e| format!("Zstandard: {e}"))?;
            Ok(out)
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Reading the caller's image
// ---------------------------------------------------------------------------------------------------------

/// Reads `len` bytes at `p` as a slice.
///
/// # Safety
/// `p` must be valid for `len` bytes of reads.
unsafe fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts(p, len) }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a module image the way cuModuleLoadData does. `Ok(None)`: not a compiled image (the caller treats
/// it as opaque).
///
/// # Safety
/// `p` must point to a module image as cuModuleLoadData requires: a fat-binary wrapper or header followed by
/// its entries, a complete ELF cubin, or NUL-terminated PTX text.
pub(crate) unsafe fn read(p: *const u8) -> CuResult<Option<Code>> {
    // SAFETY: every image is at least 4 bytes long (contract).
    let magic = u32::from_le_bytes(unsafe { bytes(p, 4) }.try_into().unwrap_or([0; 4]));
    let pieces = match magic {
        // SAFETY: per contract, a wrapper / header followed by its files.
        WRAPPER_MAGIC => unsafe { wrapper(p) }?,
        // SAFETY: as above.
        FATBIN_MAGIC => select(unsafe { fatbin_entries(p) }?)?,
        // SAFETY: a complete ELF image (contract).
        _ if magic.to_le_bytes() == ELF_MAGIC => vec![unsafe { elf_image(p) }?],
        _ => {
            // SAFETY: anything else must be NUL-terminated text to be PTX; stop at the first non-text byte.
            match unsafe { ptx_text(p) } {
                Some(text) => vec![Piece {
                    format: Format::Ptx,
                    compression: Compression::None,
                    uncompressed: text.len() as u64,
                    bytes: text,
                }],
                None => return Ok(None),
            }
        }
    };
    Ok(Some(Code {
        pieces,
        symbols: OnceLock::new(),
    }))
}

/// Reads a compiled image from a file's contents (cuModuleLoad, cuLibraryLoadFromFile): a fat binary, a cubin
/// or PTX, checked to lie inside `data` before it is read. A fat-binary wrapper holds pointers and is no file
/// format.
pub(crate) fn read_bytes(data: &[u8]) -> CuResult<Option<Code>> {
    let bad = CUDA_ERROR_INVALID_IMAGE;
    match u32_at(data, 0) {
        Some(WRAPPER_MAGIC) => return Err(bad),
        Some(FATBIN_MAGIC) => {
            let end =
                (u16_at(data, 6).unwrap_or(0) as u64).saturating_add(u64_at(data, 8).unwrap_or(u64::MAX));
            if end > data.len() as u64 {
                return Err(bad);
            }
        }
        Some(m) if m.to_le_bytes() == ELF_MAGIC => {
            let shoff = u64_at(data, 0x28).ok_or(bad)?;
            let shnum = u16_at(data, 0x3c).ok_or(bad)? as u64;
            let table = data
                .get(shoff as usize..shoff.saturating_add(shnum * 64) as usize)
                .ok_or(bad)?;
            for s in table.chunks_exact(64) {
                let end = u64_at(s, 24)
                    .unwrap_or(0)
                    .saturating_add(u64_at(s, 32).unwrap_or(0));
                if u32_at(s, 4) != Some(SHT_NOBITS) && end > data.len() as u64 {
                    return Err(bad);
                }
            }
        }
        _ => {}
    }
    // A NUL after the contents ends PTX text; the checks above keep binary formats inside `data`.
    let mut copy = Vec::with_capacity(data.len() + 8);
    copy.extend_from_slice(data);
    copy.extend_from_slice(&[0; 8]);
    // SAFETY: the image was checked to lie inside `copy`, and text is NUL-terminated.
    unsafe { read(copy.as_ptr()) }
}

/// A fat-binary wrapper: version 1 holds one fat binary, version 2 also a NULL-terminated array of
/// prelinked ones.
///
/// # Safety
/// `p` points to a wrapper whose pointers are valid fat binaries.
unsafe fn wrapper(p: *const u8) -> CuResult<Vec<Piece>> {
    // SAFETY: a wrapper is 24 bytes (two u32 and two pointers).
    let w = unsafe { bytes(p, 24) };
    let version = u32_at(w, 4).unwrap_or(0);
    let data = u64_at(w, 8).unwrap_or(0) as *const u8;
    let more = u64_at(w, 16).unwrap_or(0) as *const *const u8;
    let mut entries = Vec::new();
    if !data.is_null() {
        // SAFETY: the wrapper's data is a fat binary (contract).
        entries.extend(unsafe { fatbin_entries(data) }?);
    }
    if version == 2 && !more.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: a NULL-terminated array of fat-binary pointers (contract).
            let f = unsafe { *more.add(i) };
            if f.is_null() {
                break;
            }
            // SAFETY: each is a fat binary.
            entries.extend(unsafe { fatbin_entries(f) }?);
            i += 1;
        }
    } else if version != 1 && version != 2 {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    select(entries)
}

/// An entry of a fat binary, borrowed from the caller's image.
struct Entry<'a> {
    kind: u16,
    sm: u32,
    flags: u64,
    uncompressed: u64,
    payload: &'a [u8],
}

/// The entries of the fat binary at `p`.
///
/// # Safety
/// `p` points to a fat-binary header followed by `files_size` bytes of entries.
unsafe fn fatbin_entries<'a>(p: *const u8) -> CuResult<Vec<Entry<'a>>> {
    // SAFETY: a header is 16 bytes.
    let h = unsafe { bytes(p, 16) };
    if u32_at(h, 0) != Some(FATBIN_MAGIC) {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let header_size = u16_at(h, 6).unwrap_or(0) as usize;
    let files_size = u64_at(h, 8).unwrap_or(0);
    if header_size < 16 || files_size > MAX_UNCOMPRESSED {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: the header says how many bytes of entries follow it.
    let files = unsafe { bytes(p.add(header_size), files_size as usize) };
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 64 <= files.len() {
        let e = &files[at..];
        let bad = || CUDA_ERROR_INVALID_IMAGE;
        let kind = u16_at(e, 0).ok_or_else(bad)?;
        let ehsize = u32_at(e, 4).ok_or_else(bad)? as usize;
        let payload_size = u32_at(e, 8).ok_or_else(bad)? as usize;
        let compressed = u32_at(e, 16).ok_or_else(bad)? as usize;
        let sm = u32_at(e, 28).ok_or_else(bad)?;
        let flags = u64_at(e, 40).ok_or_else(bad)?;
        let uncompressed = if ehsize >= 64 {
            u64_at(e, 56).ok_or_else(bad)?
        } else {
            0
        };
        if ehsize < 48 {
            return Err(bad());
        }
        let stored = if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 && compressed != 0 {
            compressed
        } else {
            payload_size
        };
        let payload = e.get(ehsize..ehsize + stored).ok_or_else(bad)?;
        out.push(Entry {
            kind,
            sm,
            flags,
            uncompressed,
            payload,
        });
        at += ehsize + payload_size.max(compressed);
    }
    Ok(out)
}

/// The driver's choice for the simulated device: every cubin of the best architecture with the device's
/// major version not above it, else the PTX of the highest architecture not above it.
fn select(entries: Vec<Entry<'_>>) -> CuResult<Vec<Piece>> {
    let best_elf = entries
        .iter()
        .filter(|e| e.kind == KIND_ELF && e.sm / 10 == DEVICE_SM / 10 && e.sm <= DEVICE_SM)
        .map(|e| e.sm)
        .max();
    let chosen: Vec<&Entry<'_>> = match best_elf {
        Some(sm) => entries
            .iter()
            .filter(|e| e.kind == KIND_ELF && e.sm == sm)
            .collect(),
        None => entries
            .iter()
            .filter(|e| e.kind == KIND_PTX && e.sm <= DEVICE_SM)
            .max_by_key(|e| e.sm)
            .into_iter()
            .collect(),
    };
    if chosen.is_empty() {
        crate::abi::log(|| {
            let have: Vec<String> = entries
                .iter()
                .map(|e| {
                    format!(
                        "{}{}/{:#x}",
                        if e.kind == KIND_ELF { "sm_" } else { "compute_" },
                        e.sm,
                        e.flags
                    )
                })
                .collect();
            format!(
                "no code for sm_{DEVICE_SM} in a fat binary holding {}",
                have.join(" ")
            )
        });
    }
    Ok(chosen
        .into_iter()
        .map(|e| Piece {
            format: if e.kind == KIND_ELF {
                Format::Elf
            } else {
                Format::Ptx
            },
            compression: if e.flags & FLAG_ZSTD != 0 {
                Compression::Zstd
            } else if e.flags & FLAG_LZ4 != 0 {
                Compression::Lz4
            } else {
                Compression::None
            },
            uncompressed: if e.uncompressed != 0 {
                e.uncompressed
            } else {
                e.payload.len() as u64
            },
            bytes: e.payload.to_vec(),
        })
        .collect())
}

/// A bare cubin: its length is where its last section or header table ends.
///
/// # Safety
/// `p` points to a complete ELF64 image.
unsafe fn elf_image(p: *const u8) -> CuResult<Piece> {
    // SAFETY: an ELF64 header is 64 bytes.
    let h = unsafe { bytes(p, 64) };
    let bad = || CUDA_ERROR_INVALID_IMAGE;
    let shoff = u64_at(h, 0x28).ok_or_else(bad)?;
    let shentsize = u16_at(h, 0x3a).ok_or_else(bad)? as u64;
    let shnum = u16_at(h, 0x3c).ok_or_else(bad)? as u64;
    let phoff = u64_at(h, 0x20).ok_or_else(bad)?;
    let phentsize = u16_at(h, 0x36).ok_or_else(bad)? as u64;
    let phnum = u16_at(h, 0x38).ok_or_else(bad)? as u64;
    if h[4] != 2 || h[5] != 1 || shentsize != 64 || shoff > MAX_UNCOMPRESSED {
        return Err(bad());
    }
    let mut len = (shoff + shentsize * shnum).max(phoff + phentsize * phnum).max(64);
    // SAFETY: the section header table lies inside the image (contract).
    let table = unsafe { bytes(p.add(shoff as usize), (shentsize * shnum) as usize) };
    for i in 0..shnum as usize {
        let s = &table[i * 64..];
        let (kind, off, size) = (
            u32_at(s, 4).ok_or_else(bad)?,
            u64_at(s, 24).ok_or_else(bad)?,
            u64_at(s, 32).ok_or_else(bad)?,
        );
        if kind != SHT_NOBITS {
            len = len.max(off.saturating_add(size));
        }
    }
    if len > MAX_UNCOMPRESSED {
        return Err(bad());
    }
    // SAFETY: every section lies inside the image (contract).
    let all = unsafe { bytes(p, len as usize) };
    Ok(Piece {
        format: Format::Elf,
        compression: Compression::None,
        uncompressed: len,
        bytes: all.to_vec(),
    })
}

/// NUL-terminated PTX text (`None` when the image is not text or does not look like PTX).
///
/// # Safety
/// `p` points to a NUL-terminated string if its first bytes are text.
unsafe fn ptx_text(p: *const u8) -> Option<Vec<u8>> {
    let mut n = 0usize;
    loop {
        // SAFETY: reading stops at the NUL or at the first byte that is not text (contract).
        let b = unsafe { *p.add(n) };
        if b == 0 {
            break;
        }
        if !(b.is_ascii_graphic() || b.is_ascii_whitespace()) {
            return None;
        }
        n += 1;
    }
    // SAFETY: the n bytes before the NUL were just read.
    let text = unsafe { bytes(p, n) };
    let s = std::str::from_utf8(text).ok()?;
    (s.contains(".version") && s.contains(".target")).then(|| text.to_vec())
}

// ---------------------------------------------------------------------------------------------------------
// Symbols
// ---------------------------------------------------------------------------------------------------------

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const SHN_LORESERVE: u16 = 0xff00;

/// Kernels and globals of an ELF64 cubin.
fn elf_symbols(e: &[u8]) -> Result<Symbols, String> {
    let bad = |what: &str| format!("ELF: bad {what}");
    if e.get(..4) != Some(&ELF_MAGIC[..]) || e.get(4) != Some(&2) {
        return Err(bad("header"));
    }
    let shoff = u64_at(e, 0x28).ok_or_else(|| bad("header"))? as usize;
    let shnum = u16_at(e, 0x3c).ok_or_else(|| bad("header"))? as usize;
    let shstrndx = u16_at(e, 0x3e).ok_or_else(|| bad("header"))? as usize;
    let section = |i: usize| -> Result<(u32, u32, usize, usize, u32), String> {
        let s = e
            .get(shoff + i * 64..shoff + (i + 1) * 64)
            .ok_or_else(|| bad("section header"))?;
        Ok((
            u32_at(s, 0).unwrap_or(0),
            u32_at(s, 4).unwrap_or(0),
            u64_at(s, 24).unwrap_or(0) as usize,
            u64_at(s, 32).unwrap_or(0) as usize,
            u32_at(s, 40).unwrap_or(0),
        ))
    };
    let cstr_at = |table: usize, off: usize| -> Result<&str, String> {
        let b = e.get(table + off..).ok_or_else(|| bad("string offset"))?;
        let end = b.iter().position(|&c| c == 0).ok_or_else(|| bad("string"))?;
        std::str::from_utf8(&b[..end]).map_err(|_| bad("string"))
    };
    let (_, _, shstr, _, _) = section(shstrndx)?;
    let mut names = Vec::with_capacity(shnum);
    let mut headers = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = section(i)?;
        names.push(cstr_at(shstr, h.0 as usize)?);
        headers.push(h);
    }
    let mut out = Symbols::default();
    for &(_, kind, off, size, link) in &headers {
        if kind != SHT_SYMTAB {
            continue;
        }
        let strtab = headers
            .get(link as usize)
            .ok_or_else(|| bad("symbol string table"))?
            .2;
        let table = e.get(off..off + size).ok_or_else(|| bad("symbol table"))?;
        for sym in table.chunks_exact(24) {
            let name = cstr_at(strtab, u32_at(sym, 0).unwrap_or(0) as usize)?;
            let (info, other) = (sym[4], sym[5]);
            let shndx = u16_at(sym, 6).unwrap_or(0);
            let value = u64_at(sym, 8).unwrap_or(0) as usize;
            let sym_size = u64_at(sym, 16).unwrap_or(0);
            if name.is_empty() {
                continue;
            }
            match info & 0xf {
                STT_FUNC if other & STO_CUDA_ENTRY != 0 => {
                    out.kernels.insert(name.to_string());
                }
                STT_OBJECT if shndx != 0 && shndx < SHN_LORESERVE => {
                    let i = shndx as usize;
                    let (sec_name, &(_, sec_kind, sec_off, sec_size, _)) =
                        (names.get(i).ok_or_else(|| bad("symbol section"))?, &headers[i]);
                    if !(sec_name.starts_with(".nv.global") || sec_name.starts_with(".nv.constant")) {
                        continue;
                    }
                    let init = if sec_kind == SHT_NOBITS || value >= sec_size {
                        Vec::new()
                    } else {
                        let end = (value + sym_size as usize).min(sec_size);
                        e.get(sec_off + value..sec_off + end).unwrap_or_default().to_vec()
                    };
                    out.globals
                        .insert(name.to_string(), Global { size: sym_size, init });
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Bytes of a PTX fundamental type (`.b8` … `.f64`, `.u32`, `.s16`, `.pred` …).
fn ptx_type_size(t: &str) -> Option<u64> {
    let t = t.strip_prefix('.')?;
    if t == "pred" {
        return Some(1);
    }
    let bits: u64 = t
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .ok()?;
    matches!(t.as_bytes()[0], b'b' | b'u' | b's' | b'f').then_some(bits.div_ceil(8))
}

/// Kernels (`.entry`) and module-scope `.global` / `.const` variables of PTX text. Initialisers are not
/// evaluated (the variables start zeroed); an unsized array (`x[] = {…}`) takes its initialiser's length.
fn ptx_symbols(text: &str) -> Symbols {
    let mut out = Symbols::default();
    let mut depth = 0i32;
    // Statements end at ';' at module scope; bodies are skipped by brace depth.
    let mut stmt = String::new();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        for c in line.chars().chain(std::iter::once('\n')) {
            match c {
                '{' if depth == 0 && stmt.contains(".entry") => {
                    ptx_statement(&stmt, &mut out);
                    stmt.clear();
                    depth += 1;
                }
                '{' if depth > 0 => depth += 1,
                '}' if depth > 0 => depth -= 1,
                ';' if depth == 0 => {
                    ptx_statement(&stmt, &mut out);
                    stmt.clear();
                }
                _ if depth == 0 => stmt.push(c),
                _ => {}
            }
        }
    }
    out
}

fn ptx_statement(stmt: &str, out: &mut Symbols) {
    let toks: Vec<&str> = stmt.split_whitespace().collect();
    if let Some(i) = toks.iter().position(|t| *t == ".entry") {
        if let Some(name) = toks.get(i + 1) {
            let name = name.split('(').next().unwrap_or("");
            if !name.is_empty() {
                out.kernels.insert(name.to_string());
            }
        }
        return;
    }
    if toks.contains(&".extern") || !(toks.contains(&".global") || toks.contains(&".const")) {
        return;
    }
    let Some(ti) = toks.iter().position(|t| ptx_type_size(t).is_some()) else {
        return;
    };
    let elem = ptx_type_size(toks[ti]).unwrap_or(1);
    let decl: String = toks[ti + 1..].join(" ");
    let (lhs, init) = match decl.split_once('=') {
        Some((l, r)) => (l.trim(), Some(r)),
        None => (decl.trim(), None),
    };
    let name = lhs.split('[').next().unwrap_or("").trim();
    if name.is_empty() {
        return;
    }
    let mut count = 1u64;
    for dim in lhs.split('[').skip(1) {
        let d = dim.split(']').next().unwrap_or("").trim();
        count *= if d.is_empty() {
            init.map(|i| i.split(',').filter(|x| !x.trim().is_empty()).count() as u64)
                .unwrap_or(0)
        } else {
            d.parse().unwrap_or(0)
        };
    }
    out.globals.insert(
        name.to_string(),
        Global {
            size: elem * count,
            init: Vec::new(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_names_and_sizes() {
        let ptx = r#"
            .version 8.0
            .target sm_90
            .address_size 64
            .extern .global .align 4 .u32 elsewhere;
            .visible .global .align 4 .b8 _ZN6cublas8internal15deviceConstantsE[128];
            .global .u32 counter;
            .const .align 8 .f64 coeffs[2][3];
            .visible .const .align 4 .b32 table[] = {1, 2, 3};
            .visible .entry _Z3addPfS_(
                .param .u64 a, // comment {
                .param .u64 b
            )
            {
                .reg .b32 %r<4>;
                .shared .align 4 .b8 smem[64];
                { ret; }
            }
            .entry plain() { ret; }
        "#;
        let s = ptx_symbols(ptx);
        assert_eq!(
            s.kernels,
            ["_Z3addPfS_", "plain"].map(String::from).into_iter().collect()
        );
        let size = |n: &str| s.globals.get(n).map(|g| g.size);
        assert_eq!(size("_ZN6cublas8internal15deviceConstantsE"), Some(128));
        assert_eq!(size("counter"), Some(4));
        assert_eq!(size("coeffs"), Some(48));
        assert_eq!(size("table"), Some(12));
        assert_eq!(size("elsewhere"), None);
        assert_eq!(size("smem"), None);
    }

    /// A minimal cubin: a kernel, a device function, an initialised global and a zeroed one.
    fn tiny_elf() -> Vec<u8> {
        let shstr = b"\0.shstrtab\0.strtab\0.symtab\0.nv.global.init\0.nv.global\0.text.k\0";
        let strtab = b"\0k\0helper\0g_init\0g_zero\0";
        let init = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let sym = |name: u32, info: u8, other: u8, shndx: u16, value: u64, size: u64| {
            let mut v = Vec::new();
            v.extend_from_slice(&name.to_le_bytes());
            v.extend_from_slice(&[info, other]);
            v.extend_from_slice(&shndx.to_le_bytes());
            v.extend_from_slice(&value.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v
        };
        let mut symtab = vec![0u8; 24];
        symtab.extend(sym(1, 0x12, 0x10, 6, 0, 16)); // k: global FUNC, entry
        symtab.extend(sym(3, 0x22, 0, 6, 0, 16)); // helper: weak FUNC
        symtab.extend(sym(10, 0x11, 0, 4, 4, 4)); // g_init: OBJECT in .nv.global.init at 4
        symtab.extend(sym(17, 0x11, 0, 5, 0, 256)); // g_zero: OBJECT in .nv.global
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(&ELF_MAGIC);
        e[4] = 2;
        e[5] = 1;
        let mut place = |data: &[u8]| {
            let off = e.len();
            e.extend_from_slice(data);
            off
        };
        let o_shstr = place(shstr);
        let o_str = place(strtab);
        let o_sym = place(&symtab);
        let o_init = place(&init);
        let shoff = e.len();
        let sh = |name: u32, kind: u32, off: usize, size: usize, link: u32| {
            let mut v = vec![0u8; 64];
            v[0..4].copy_from_slice(&name.to_le_bytes());
            v[4..8].copy_from_slice(&kind.to_le_bytes());
            v[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            v[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            v[40..44].copy_from_slice(&link.to_le_bytes());
            v
        };
        let table = [
            vec![0u8; 64],
            sh(1, 3, o_shstr, shstr.len(), 0),
            sh(11, 3, o_str, strtab.len(), 0),
            sh(19, SHT_SYMTAB, o_sym, symtab.len(), 2),
            sh(27, 1, o_init, init.len(), 0),
            sh(43, SHT_NOBITS, 0, 256, 0),
            sh(54, 1, o_init, 0, 0),
        ];
        for s in table {
            e.extend(s);
        }
        e[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&7u16.to_le_bytes());
        e[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        e
    }

    #[test]
    fn elf_names_sizes_and_initial_bytes() {
        let s = elf_symbols(&tiny_elf()).unwrap();
        assert_eq!(s.kernels, ["k".to_string()].into_iter().collect());
        assert_eq!(
            s.globals.get("g_init"),
            Some(&Global {
                size: 4,
                init: vec![5, 6, 7, 8]
            })
        );
        assert_eq!(
            s.globals.get("g_zero"),
            Some(&Global {
                size: 256,
                init: vec![]
            })
        );
        assert!(elf_symbols(&tiny_elf()[..40]).is_err());
    }

    /// A fat binary with an sm_80 cubin, an sm_90 cubin (LZ4) and compute_90 PTX: the device takes sm_90.
    fn fatbin(entries: &[(u16, u32, u64, Vec<u8>, u64)]) -> Vec<u8> {
        let mut files = Vec::new();
        for (kind, sm, flags, payload, uncompressed) in entries {
            let mut h = vec![0u8; 64];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
                h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            }
            h[28..32].copy_from_slice(&sm.to_le_bytes());
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            h[56..64].copy_from_slice(&uncompressed.to_le_bytes());
            files.extend(h);
            files.extend(payload);
        }
        let mut f = Vec::new();
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(files.len() as u64).to_le_bytes());
        f.extend(files);
        f
    }

    #[test]
    fn fatbin_selection_and_lz4() {
        let elf = tiny_elf();
        let lz4 = lz4_flex::block::compress(&elf);
        let ptx = b".version 8.0\n.target sm_90\n.visible .entry from_ptx() { ret; }\n".to_vec();
        let other = b"not this one".to_vec();
        let img = fatbin(&[
            (KIND_ELF, 80, 0x11, other.clone(), 0),
            (KIND_ELF, 90, 0x11 | FLAG_LZ4, lz4, elf.len() as u64),
            (KIND_PTX, 90, 0x11, ptx.clone(), 0),
        ]);
        // SAFETY: a complete fat binary in memory.
        let code = unsafe { read(img.as_ptr()) }.unwrap().unwrap();
        assert_eq!(code.pieces.len(), 1);
        let s = code.symbols().unwrap();
        assert!(s.kernels.contains("k") && !s.kernels.contains("from_ptx"));

        // No sm_9x cubin: the PTX (JIT), never a cubin of another major version.
        let img = fatbin(&[
            (KIND_ELF, 80, 0x11, other.clone(), 0),
            (KIND_PTX, 80, 0x11, ptx, 0),
        ]);
        // SAFETY: as above.
        let code = unsafe { read(img.as_ptr()) }.unwrap().unwrap();
        assert!(code.symbols().unwrap().kernels.contains("from_ptx"));

        assert_eq!(code.runs_here(), Ok(()));

        // Only newer or foreign code: no binary for this GPU.
        let img = fatbin(&[
            (KIND_ELF, 100, 0x11, other.clone(), 0),
            (KIND_ELF, 80, 0x11, other, 0),
        ]);
        // SAFETY: as above.
        let code = unsafe { read(img.as_ptr()) }.unwrap().unwrap();
        assert_eq!(code.runs_here(), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
    }

    #[test]
    fn bare_cubin_and_ptx_and_other_images() {
        let elf = tiny_elf();
        // SAFETY: a complete ELF image.
        let code = unsafe { read(elf.as_ptr()) }.unwrap().unwrap();
        assert!(code.symbols().unwrap().globals.contains_key("g_zero"));
        let ptx = b"// generated\n.version 8.0\n.target sm_80\n.entry k() { ret; }\n\0";
        // SAFETY: NUL-terminated text.
        let code = unsafe { read(ptx.as_ptr()) }.unwrap().unwrap();
        assert!(code.symbols().unwrap().kernels.contains("k"));
        let junk = [0x01u8, 0x02, 0x03, 0x04, 0, 0, 0, 0];
        // SAFETY: 8 readable bytes; not text past the first byte.
        assert!(unsafe { read(junk.as_ptr()) }.unwrap().is_none());
        // From a file: truncated binaries are refused instead of read past their end.
        assert!(read_bytes(&elf).unwrap().is_some());
        assert_eq!(
            read_bytes(&elf[..elf.len() - 8]).err(),
            Some(CUDA_ERROR_INVALID_IMAGE)
        );
        assert!(read_bytes(&ptx[..ptx.len() - 1]).unwrap().is_some());
    }
}
