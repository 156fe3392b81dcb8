//! The header both region files start with: validated on every open, initialised by whoever finds a fresh
//! (zero) file. All values are deterministic, so racing initialisers agree; the magic is published last.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::RegionError;

/// A header field holding a size or a count.
pub(super) enum Word<'a> {
    /// A 32-bit field.
    U32(&'a AtomicU32),
    /// A 64-bit field.
    U64(&'a AtomicU64),
}

impl Word<'_> {
    fn load(&self) -> u64 {
        match self {
            Word::U32(w) => w.load(Ordering::Relaxed).into(),
            Word::U64(w) => w.load(Ordering::Relaxed),
        }
    }

    fn store(&self, v: u64) {
        match self {
            Word::U32(w) => w.store(v as u32, Ordering::Relaxed),
            Word::U64(w) => w.store(v, Ordering::Relaxed),
        }
    }
}

/// What one file's header must say.
pub(super) struct Header<'a> {
    /// The `magic` field and the value it must hold.
    pub magic: (&'a AtomicU64, u64),
    /// `abi_version` and the version this layout is (`layout::ABI_VERSION`, or `PRIORITY_ABI_VERSION`).
    pub abi_version: (&'a AtomicU32, u32),
    /// `(name, field, value our layout needs)`: header size, total size, table sizes.
    pub fields: &'a [(&'static str, Word<'a>, u64)],
}

/// Checks the header against our layout. With `init`, a zero magic (a fresh file) is initialised first;
/// without, it is [`RegionError::NotInitialized`].
pub(super) fn validate(path: &Path, h: &Header<'_>, init: bool) -> Result<(), RegionError> {
    let (magic, expected) = h.magic;
    let found = magic.load(Ordering::Acquire);
    if found == 0 {
        if !init {
            return Err(RegionError::NotInitialized {
                path: path.to_path_buf(),
            });
        }
        h.abi_version.0.store(h.abi_version.1, Ordering::Relaxed);
        for (_, field, value) in h.fields {
            field.store(*value);
        }
        // Racing initialisers store the same values; a CAS makes the publication a single event.
        let _ = magic.compare_exchange(0, expected, Ordering::Release, Ordering::Acquire);
    } else if found != expected {
        return Err(RegionError::BadMagic {
            path: path.to_path_buf(),
            found,
            expected,
        });
    }
    let (word, expected) = h.abi_version;
    let version = word.load(Ordering::Acquire);
    if version != expected {
        return Err(RegionError::VersionMismatch {
            path: path.to_path_buf(),
            found: version,
            expected,
        });
    }
    for (name, field, value) in h.fields {
        let found = field.load();
        if found != *value {
            return Err(RegionError::LayoutMismatch {
                path: path.to_path_buf(),
                field: name,
                found,
                expected: *value,
            });
        }
    }
    Ok(())
}
