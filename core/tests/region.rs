//! Region tests: seqlock (including a writer that dies mid-write), slot claim/reclaim, pid reuse, exact
//! admission under concurrency, multiple mappings, a SIGKILLed child's usage reclaimed, header validation.
//!
//! Child processes are this test binary re-executed with `CQ_TEST_CHILD=<role>` running the `child_helper`
//! test, so they are real processes with their own pid.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cuquota_core::region::layout::{
    self, LIMITS_FLAG_MEMBERS, LIMITS_FLAG_NO_OPT_OUT, LIMITS_MAX_MEMBERS, MAX_PROCS,
};
use cuquota_core::region::liveness::{current_pid, current_start_time};
use cuquota_core::region::{
    DeviceSelector, LimitsReader, LimitsRegion, LimitsWriter, RegionError, UsageRegion,
};

const G: u64 = 1 << 30;
const UUID_A: [u8; 16] = [0xa; 16];
const UUID_B: [u8; 16] = [0xb; 16];

struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "cuquota-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&p);
        TempFile(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

// ---- child processes ---------------------------------------------------------------------------------------

fn spawn_child(role: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("CQ_TEST_CHILD", role)
        .env("CQ_TEST_PATH", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Waits for the child to print `READY`.
fn wait_ready(child: &mut Child) {
    let out = child.stdout.as_mut().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.trim() == "READY" => return,
            Some(Ok(_)) => continue,
            other => panic!("child ended before READY: {other:?}"),
        }
    }
}

/// Not a test: the body of the child processes the tests above spawn (ignored in a normal run).
#[test]
#[ignore = "not a test: the child process other tests spawn (with CQ_TEST_CHILD set)"]
fn child_helper() {
    let role = std::env::var("CQ_TEST_CHILD").expect("CQ_TEST_CHILD: run only as a child of another test");
    let path = PathBuf::from(std::env::var("CQ_TEST_PATH").unwrap());
    let ready = || {
        println!("READY");
        std::io::stdout().flush().unwrap();
    };
    match role.as_str() {
        "charge-and-wait" => {
            let r = UsageRegion::open(&path).unwrap();
            let slot = r.process_slot().unwrap();
            let dev = r.device(&UUID_A).unwrap();
            r.try_charge(slot, dev, G, Some(2 * G)).unwrap();
            ready();
            std::thread::sleep(Duration::from_secs(600));
        }
        "open-claim-charge" => {
            let r = UsageRegion::open(&path).unwrap();
            let slot = r.process_slot().unwrap();
            let dev = r.device(&UUID_A).unwrap();
            r.try_charge(slot, dev, 1 << 20, None).unwrap();
            let dev_b = r.device(&UUID_B).unwrap();
            r.try_charge(slot, dev_b, 1 << 20, None).unwrap();
            ready();
            std::thread::sleep(Duration::from_secs(600));
        }
        "die-mid-write" => {
            let w = LimitsWriter::open(&path).unwrap();
            w.begin_write_and_stop(|| {
                // SAFETY: raising SIGKILL on ourselves; nothing to clean up.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            })
            .unwrap();
            unreachable!("SIGKILL returned");
        }
        other => panic!("unknown role {other}"),
    }
}

// ---- limits: seqlock -----------------------------------------------------------------------------------

fn set_memory(w: &LimitsWriter, sel: DeviceSelector, bytes: u64) {
    w.update(|t| -> Result<(), std::convert::Infallible> {
        t.entry_mut(sel).unwrap().memory_limit = bytes;
        Ok(())
    })
    .unwrap()
    .unwrap();
}

#[test]
fn a_memory_request_lives_in_the_entrys_last_word_and_zero_means_the_limit() {
    let f = TempFile::new("request");
    let w = LimitsWriter::create(f.path()).unwrap();
    set_memory(&w, DeviceSelector::All, 8 * G);
    // Control: an entry written without a request (every file before the word had a meaning: it was reserved
    // and zero) guarantees its limit.
    let r = LimitsReader::open(f.path()).unwrap();
    let p = r.snapshot().for_device(None, Some(0));
    assert_eq!((p.memory_request, p.request_in_force()), (None, Some(8 * G)));
    w.update(|t| -> Result<(), ()> {
        t.entry_mut(DeviceSelector::All).unwrap().memory_request = 2 * G;
        Ok(())
    })
    .unwrap()
    .unwrap();
    let p = LimitsReader::open(f.path())
        .unwrap()
        .snapshot()
        .for_device(None, Some(0));
    assert_eq!((p.memory, p.memory_request), (Some(8 * G), Some(2 * G)));
    assert!(p.is_elastic());
    // The word on disk is the entry's last (offset 56 of 64), beside the policy words, not inside them.
    let bytes = std::fs::read(f.path()).unwrap();
    let entry0 = std::mem::offset_of!(layout::LimitsFile, devices);
    let at = entry0 + std::mem::offset_of!(layout::LimitsEntry, memory_request);
    assert_eq!(at - entry0, 56);
    assert_eq!(u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap()), 2 * G);
    // A foreign writer's request above the limit never counts for more than the limit.
    w.update(|t| -> Result<(), ()> {
        t.entry_mut(DeviceSelector::All).unwrap().memory_request = 9 * G;
        Ok(())
    })
    .unwrap()
    .unwrap();
    let p = LimitsReader::open(f.path())
        .unwrap()
        .snapshot()
        .for_device(None, Some(0));
    assert_eq!(p.request_in_force(), Some(8 * G));
    assert!(p.check_request().is_err());
}

#[test]
fn limits_write_read_and_match() {
    let f = TempFile::new("limits");
    let w = LimitsWriter::create(f.path()).unwrap();
    set_memory(&w, DeviceSelector::All, 8 * G);
    set_memory(&w, DeviceSelector::Index(1), 2 * G);
    set_memory(&w, DeviceSelector::Uuid(UUID_A), 4 * G);
    w.update(|t| -> Result<(), ()> {
        t.entry_mut(DeviceSelector::Index(1)).unwrap().sm_limit = 30;
        t.flags |= LIMITS_FLAG_NO_OPT_OUT;
        Ok(())
    })
    .unwrap()
    .unwrap();

    let mut r = LimitsReader::open(f.path()).unwrap();
    let s = *r.snapshot();
    assert_eq!(
        s.for_device(Some(&UUID_A), Some(1)).memory,
        Some(4 * G),
        "uuid beats index"
    );
    assert_eq!(s.for_device(Some(&UUID_B), Some(1)).memory, Some(2 * G));
    assert_eq!(s.for_device(Some(&UUID_B), Some(1)).sm, Some(30));
    assert_eq!(s.for_device(None, Some(5)).memory, Some(8 * G), "all");
    assert!(!s.opt_out_allowed());
    assert!(!r.needs_refresh());

    set_memory(&w, DeviceSelector::All, G);
    assert!(r.needs_refresh(), "one atomic load sees the change");
    assert!(r.refresh());
    assert_eq!(r.snapshot().for_device(None, Some(5)).memory, Some(G));
    assert!(!r.needs_refresh());
    assert!(r.snapshot().generation > s.generation);

    // an edit that fails publishes nothing
    let before = r.region().seq();
    assert!(w
        .update(|t| {
            t.entry_mut(DeviceSelector::All).unwrap().memory_limit = 1;
            Err("no")
        })
        .unwrap()
        .is_err());
    assert_eq!(w.read().unwrap().for_device(None, Some(5)).memory, Some(G));
    assert_ne!(r.region().seq(), before - 1);
    assert!(!r.refresh(), "contents unchanged");
}

#[test]
fn usage_binding_set_read_and_refused_when_malformed() {
    use std::path::Path;
    let f = TempFile::new("usagebind");
    let w = LimitsWriter::create(f.path()).unwrap();
    let mut r = LimitsReader::open(f.path()).unwrap();
    assert_eq!(r.snapshot().usage_path(), Ok(None), "not bound in a fresh file");
    let long = format!("/{}", "x".repeat(layout::LIMITS_USAGE_PATH_MAX - 1));
    for p in ["/run/cuquota/usage", long.as_str()] {
        w.update(|t| t.set_usage(Some(Path::new(p)), None))
            .unwrap()
            .unwrap();
        r.refresh();
        assert_eq!(r.snapshot().usage_path(), Ok(Some(Path::new(p))));
    }
    let too_long = format!("/{}", "x".repeat(layout::LIMITS_USAGE_PATH_MAX));
    for bad in ["relative/usage", too_long.as_str()] {
        let e = w
            .update(|t| t.set_usage(Some(Path::new(bad)), None))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("must be absolute"), "{e}");
    }
    r.refresh();
    assert_eq!(
        r.snapshot().usage_path(),
        Ok(Some(Path::new(long.as_str()))),
        "unchanged by refusals"
    );
    w.update(|t| t.set_usage(None, None)).unwrap().unwrap();
    r.refresh();
    assert_eq!(r.snapshot().usage_path(), Ok(None));
}

/// Issue 21, item 6: the binding records the usage file's identity, and opening the bound path refuses any
/// other file there (renamed away and replaced, recreated, or missing) rather than starting a fresh region.
#[test]
fn a_bound_usage_file_is_opened_only_if_it_is_the_bound_one() {
    use cuquota_core::region::{FileId, RegionError, UsageRegion};
    let lf = TempFile::new("usagebind-id-limits");
    let uf = TempFile::new("usagebind-id-usage");
    let id = UsageRegion::open(uf.path()).unwrap().file_id().unwrap();
    assert_ne!(id.ino, 0);
    let w = LimitsWriter::create(lf.path()).unwrap();
    w.update(|t| t.set_usage(Some(uf.path()), Some(id)))
        .unwrap()
        .unwrap();
    let r = LimitsReader::open(lf.path()).unwrap();
    assert_eq!(r.snapshot().usage_path(), Ok(Some(uf.path())));
    assert_eq!(r.snapshot().usage_id(), Ok(Some(id)));
    let region = UsageRegion::open_bound(uf.path(), id).expect("the bound file itself");
    // a running process follows the binding: another file bound → its file fails `check`; bound again → fine
    assert_eq!(region.file_id(), Some(id));
    assert!(!region.follow_binding(&[id]));
    region.check().expect("still the bound file");
    let other = FileId {
        ino: id.ino + 1,
        ..id
    };
    assert!(region.follow_binding(&[other]));
    assert!(matches!(region.check(), Err(RegionError::Superseded { .. })));
    assert!(region.follow_binding(&[]), "unbound: nothing to compare");
    region.check().expect("no binding, no refusal");
    drop(region);

    // renamed away: nothing at the path is refused, and nothing is created there
    let away = uf.path().with_extension("away");
    std::fs::rename(uf.path(), &away).unwrap();
    let e = UsageRegion::open_bound(uf.path(), id).expect_err("missing");
    assert!(
        matches!(e, RegionError::NotTheBoundFile { found: None, .. }),
        "{e}"
    );
    assert!(!uf.path().exists(), "a bound open must not create the file");
    // a fresh file, and a byte-for-byte copy of the bound one, at the path: both refused, naming the file
    for fresh in [false, true] {
        if fresh {
            drop(UsageRegion::open(uf.path()).unwrap());
        } else {
            std::fs::copy(&away, uf.path()).unwrap();
        }
        let e = UsageRegion::open_bound(uf.path(), id).expect_err("replaced");
        let msg = e.to_string();
        assert!(
            matches!(e, RegionError::NotTheBoundFile { found: Some(_), .. }),
            "{msg}"
        );
        assert!(
            msg.contains(&uf.path().display().to_string()) && msg.contains("replaced"),
            "{msg}"
        );
        std::fs::remove_file(uf.path()).unwrap();
    }
    // renamed back: accepted again
    std::fs::rename(&away, uf.path()).unwrap();
    UsageRegion::open_bound(uf.path(), id).expect("the bound file, back in place");
    // deleted and recreated: refused even where the file system hands out the same inode number again
    // (ext4 does at once), by the birth time
    std::fs::remove_file(uf.path()).unwrap();
    let again = UsageRegion::open(uf.path()).unwrap().file_id().unwrap();
    let e = UsageRegion::open_bound(uf.path(), id).err();
    assert!(
        e.is_some() || (again.ino == id.ino && id.btime_ns == 0),
        "a recreated file (inode {} then {}) was taken for the bound one",
        id.ino,
        again.ino
    );
    // unbinding forgets the identity
    w.update(|t| t.set_usage(None, Some(id))).unwrap().unwrap();
    assert_eq!(w.read().unwrap().usage_id(), Ok(None));
}

#[test]
fn members_set_clear_and_read() {
    let f = TempFile::new("members");
    let w = LimitsWriter::create(f.path()).unwrap();
    set_memory(&w, DeviceSelector::All, G);
    let mut r = LimitsReader::open(f.path()).unwrap();
    assert_eq!(
        r.snapshot().members(),
        None,
        "no agent membership in a fresh file"
    );
    assert!(!r.snapshot().is_member(42));

    w.set_members(&[30, 10, 20, 10]).unwrap();
    assert!(r.needs_refresh());
    assert!(r.refresh());
    assert_eq!(
        r.snapshot().members(),
        Some(&[10, 20, 30][..]),
        "sorted, deduplicated"
    );
    assert!(r.snapshot().flags & LIMITS_FLAG_MEMBERS != 0);
    assert!(r.snapshot().is_member(20) && !r.snapshot().is_member(25));
    // the entries are untouched by a member write
    assert_eq!(r.snapshot().for_device(None, Some(0)).memory, Some(G));

    // the same list again writes nothing: running processes do not re-read every agent pass
    let seq = r.region().seq();
    w.set_members(&[20, 30, 10]).unwrap();
    assert_eq!(r.region().seq(), seq);
    assert!(!r.needs_refresh());

    // an empty list is agent membership with no member (not "no membership")
    w.set_members(&[]).unwrap();
    assert!(r.refresh());
    assert_eq!(r.snapshot().members(), Some(&[][..]));

    // a full list, then one too many: a typed error naming the count, nothing changed
    let full: Vec<u32> = (1..=LIMITS_MAX_MEMBERS as u32).collect();
    w.set_members(&full).unwrap();
    assert!(r.refresh());
    assert_eq!(r.snapshot().members().unwrap().len(), LIMITS_MAX_MEMBERS);
    let seq = r.region().seq();
    let over: Vec<u32> = (1..=LIMITS_MAX_MEMBERS as u32 + 1).collect();
    let e = w.set_members(&over).unwrap_err();
    assert_eq!(
        e,
        RegionError::TooManyMembers {
            path: f.path().to_path_buf(),
            count: LIMITS_MAX_MEMBERS + 1,
            max: LIMITS_MAX_MEMBERS
        }
    );
    assert!(e.to_string().contains("1025 member pids"), "{e}");
    assert!(matches!(
        w.set_members(&[5, 0]),
        Err(RegionError::InvalidMember { pid: 0, .. })
    ));
    assert_eq!(r.region().seq(), seq, "a refused list writes nothing");

    // a shorter list leaves no stale pids behind
    w.set_members(&[7]).unwrap();
    assert!(r.refresh());
    assert_eq!(r.snapshot().members(), Some(&[7][..]));
    assert!(!r.snapshot().is_member(8));

    w.clear_members().unwrap();
    assert!(r.refresh());
    assert_eq!(r.snapshot().members(), None);
    assert_eq!(r.snapshot().flags & LIMITS_FLAG_MEMBERS, 0);
    let seq = r.region().seq();
    w.clear_members().unwrap();
    assert_eq!(r.region().seq(), seq, "clearing twice writes once");
}

#[test]
fn seqlock_readers_never_see_torn_writes() {
    let f = TempFile::new("seqlock");
    let w = LimitsWriter::create(f.path()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let path = f.path().to_path_buf();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let region = LimitsRegion::open(&path).unwrap();
                let mut good = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(s) = region.try_read() {
                        // Every write sets all 16 entries to the same value: a torn copy would mix values.
                        let v = s.entries[0].memory_limit;
                        assert!(
                            s.entries
                                .iter()
                                .all(|e| e.memory_limit == v && e.sm_limit as u64 == v % 97),
                            "torn"
                        );
                        assert_eq!(s.seq % 2, 0);
                        good += 1;
                    }
                }
                good
            })
        })
        .collect();
    for k in 1..=20_000u64 {
        w.update(|t| -> Result<(), ()> {
            for (i, e) in t.entries.iter_mut().enumerate() {
                *e = layout_entry(i as u32, k);
            }
            Ok(())
        })
        .unwrap()
        .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0, "a reader never got a consistent copy");
    }
}

fn layout_entry(i: u32, k: u64) -> cuquota_core::region::LimitsEntryData {
    cuquota_core::region::LimitsEntryData {
        flags: layout::LIMITS_ENTRY_VALID,
        cuda_index: i,
        raw: cuquota_core::PolicyRaw {
            memory_limit: k,
            sm_limit: (k % 97) as u32,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn reader_keeps_last_good_snapshot_while_writer_is_stuck() {
    let f = TempFile::new("stuck");
    let w = LimitsWriter::create(f.path()).unwrap();
    set_memory(&w, DeviceSelector::All, 3 * G);
    let mut r = LimitsReader::open(f.path()).unwrap();

    // A writer in another process dies mid-write: seq stays odd, one field is scribbled.
    let mut child = spawn_child("die-mid-write", f.path());
    let status = child.wait().unwrap();
    assert!(!status.success());
    let seq = r.region().seq();
    assert_eq!(seq % 2, 1, "write left open");

    assert!(r.needs_refresh());
    let t0 = std::time::Instant::now();
    assert!(!r.refresh());
    // The read gives up after a fixed number of tries (the last ones yield the CPU, which on a loaded machine may
    // take a time slice each): bounded, but not by a wall-clock figure a busy CPU could break. A hang never returns.
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "bounded read, never a hang: took {:?}",
        t0.elapsed()
    );
    assert!(r.is_stale());
    assert_eq!(
        r.snapshot().for_device(None, Some(0)).memory,
        Some(3 * G),
        "last good snapshot kept"
    );
    assert!(
        !r.needs_refresh(),
        "a stuck writer costs one bounded read, not one per call"
    );
    assert!(matches!(
        r.region().try_read(),
        Err(cuquota_core::region::ReadError::Busy { .. })
    ));

    // The next writer takes the dead writer's lock over and publishes a consistent state.
    set_memory(&w, DeviceSelector::All, 5 * G);
    assert!(r.needs_refresh());
    assert!(r.refresh());
    assert!(!r.is_stale());
    assert_eq!(r.snapshot().for_device(None, Some(0)).memory, Some(5 * G));
    assert_eq!(r.region().seq() % 2, 0);
}

#[test]
fn an_open_write_with_no_writer_recorded_is_adopted_at_once() {
    // An agent written against an older protocol died after making `seq` odd but before recording its pid.
    use std::os::unix::fs::FileExt;
    let f = TempFile::new("limits-unrecorded");
    let w = LimitsWriter::create(f.path()).unwrap();
    set_memory(&w, DeviceSelector::All, 3 * G);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(f.path())
        .unwrap();
    let off = std::mem::offset_of!(layout::LimitsHeader, seq) as u64;
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, off).unwrap();
    let seq = u64::from_ne_bytes(b);
    assert_eq!(seq % 2, 0);
    file.write_all_at(&(seq + 1).to_ne_bytes(), off).unwrap();
    let pid_off = std::mem::offset_of!(layout::LimitsHeader, writer_pid) as u64;
    let mut p = [0u8; 4];
    file.read_exact_at(&mut p, pid_off).unwrap();
    assert_eq!(u32::from_ne_bytes(p), 0, "no writer recorded");

    let t0 = std::time::Instant::now();
    set_memory(&w, DeviceSelector::All, 5 * G);
    assert!(
        // Waiting for the writer would take the whole 2 s busy wait; a loaded CPU alone never comes near that.
        t0.elapsed() < Duration::from_millis(1500),
        "adopted without a grace period: {:?}",
        t0.elapsed()
    );
    let r = LimitsReader::open(f.path()).unwrap();
    assert_eq!(r.snapshot().for_device(None, Some(0)).memory, Some(5 * G));
    assert_eq!(r.region().seq() % 2, 0);
}

#[test]
fn limits_header_validation() {
    let f = TempFile::new("limits-hdr");
    // Read-only open of a file nobody initialised.
    std::fs::write(f.path(), vec![0u8; std::mem::size_of::<layout::LimitsFile>()]).unwrap();
    assert!(matches!(
        LimitsRegion::open(f.path()),
        Err(RegionError::NotInitialized { .. })
    ));
    drop(LimitsWriter::create(f.path()).unwrap());
    assert!(LimitsRegion::open(f.path()).is_ok());

    let mut bytes = std::fs::read(f.path()).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_ne_bytes());
    std::fs::write(f.path(), &bytes).unwrap();
    let e = LimitsRegion::open(f.path()).err().unwrap();
    assert_eq!(
        e,
        RegionError::VersionMismatch {
            path: f.path().to_path_buf(),
            found: 99,
            expected: layout::ABI_VERSION
        }
    );
    assert!(e.to_string().contains("ABI version 99"));

    bytes[0..8].copy_from_slice(b"NOTMAGIC");
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(matches!(
        LimitsRegion::open(f.path()),
        Err(RegionError::BadMagic { .. })
    ));

    // A file of another ABI version (another size) is named as such, not just as a bad size.
    let mut old = bytes[..64 + 64 * layout::MAX_DEVICES].to_vec();
    old[0..8].copy_from_slice(b"CUQLIMIT");
    old[8..12].copy_from_slice(&2u32.to_ne_bytes());
    std::fs::write(f.path(), &old).unwrap();
    let e = LimitsRegion::open(f.path()).err().unwrap();
    assert!(
        matches!(e, RegionError::VersionMismatch { found: 2, .. }),
        "{e:?}"
    );

    std::fs::write(f.path(), b"short").unwrap();
    assert!(matches!(
        LimitsRegion::open(f.path()),
        Err(RegionError::BadSize { size: 5, .. })
    ));
    assert!(matches!(
        LimitsRegion::open(Path::new("/nonexistent/x")),
        Err(RegionError::Io { op: "open", .. })
    ));
    // A usage file is not a limits file (different size, different magic).
    let u = TempFile::new("usage-as-limits");
    drop(UsageRegion::open(u.path()).unwrap());
    assert!(matches!(
        LimitsRegion::open(u.path()),
        Err(RegionError::BadSize { .. })
    ));
}

// ---- usage ----------------------------------------------------------------------------------------------

#[test]
fn usage_header_validation() {
    let f = TempFile::new("usage-hdr");
    drop(UsageRegion::open(f.path()).unwrap());
    let mut bytes = std::fs::read(f.path()).unwrap();
    assert_eq!(&bytes[0..8], b"CUQUSAGE");
    let next = layout::ABI_VERSION + 1;
    bytes[8..12].copy_from_slice(&next.to_ne_bytes());
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(matches!(
        UsageRegion::open(f.path()),
        Err(RegionError::VersionMismatch { found, .. }) if found == next
    ));
    bytes[0..8].copy_from_slice(b"CUQLIMIT");
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(matches!(
        UsageRegion::open(f.path()),
        Err(RegionError::BadMagic { .. })
    ));
    bytes[0..8].copy_from_slice(b"CUQUSAGE");
    bytes[8..12].copy_from_slice(&layout::ABI_VERSION.to_ne_bytes());
    bytes[28..32].copy_from_slice(&7u32.to_ne_bytes()); // max_procs
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(matches!(
        UsageRegion::open(f.path()),
        Err(RegionError::LayoutMismatch {
            field: "max_procs",
            found: 7,
            ..
        })
    ));
    let missing = TempFile::new("usage-missing");
    assert!(matches!(
        UsageRegion::open_existing(missing.path()),
        Err(RegionError::Io { .. })
    ));
}

#[test]
fn pid_reuse_is_detected_by_start_time() {
    let f = TempFile::new("reuse");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let real = r.claim_slot().unwrap();
    // Same pid as ours, but another start time: the slot's owner is a previous process with our pid.
    let ghost = r
        .claim_slot_as(current_pid(), current_start_time() + 12345)
        .unwrap();
    assert_ne!(real, ghost);
    r.try_charge(real, dev, G, None).unwrap();
    r.try_charge(ghost, dev, 3 * G, None).unwrap();
    assert_eq!(r.container_used(dev), 4 * G);
    assert_eq!(r.reclaim_dead(), 1);
    assert_eq!(r.container_used(dev), G, "only the ghost's usage is gone");
    assert_eq!(r.slot_used(real, dev), G);
    assert_eq!(r.processes().len(), 1);
    // a slot of a pid that does not exist
    let _gone = r.claim_slot_as(i32::MAX as u32 - 1, 1).unwrap();
    assert_eq!(r.reclaim_dead(), 1);
    // the freed slot is reusable
    let again = r.claim_slot_as(current_pid(), current_start_time()).unwrap();
    assert_eq!(r.slot_used(again, dev), 0);
}

#[test]
fn release_and_fork_forget() {
    let f = TempFile::new("release");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let s = r.process_slot().unwrap();
    assert_eq!(r.process_slot().unwrap(), s, "cached");
    r.try_charge(s, dev, G, None).unwrap();
    r.forget_slot_in_child();
    assert_eq!(r.cached_slot(), None);
    let child_slot = r.process_slot().unwrap();
    assert_ne!(child_slot, s, "a forked child claims its own slot");
    assert_eq!(r.slot_used(s, dev), G, "the parent's slot is untouched");
    r.release_process_slot();
    r.release_slot(s);
    assert_eq!(r.container_used(dev), 0);
    assert!(r.processes().is_empty());
}

#[test]
fn uncharge_never_underflows() {
    let f = TempFile::new("underflow");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let s = r.claim_slot().unwrap();
    r.try_charge(s, dev, 100, None).unwrap();
    assert_eq!(r.uncharge(s, dev, 250), 100);
    assert_eq!(r.container_used(dev), 0);
}

#[test]
fn over_limit_reports_used_and_limit() {
    let f = TempFile::new("over");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let s = r.claim_slot().unwrap();
    r.try_charge(s, dev, 3 * G, Some(4 * G)).unwrap();
    let e = r.try_charge(s, dev, 2 * G, Some(4 * G)).unwrap_err();
    assert_eq!((e.used, e.limit, e.requested), (3 * G, 4 * G, 2 * G));
    assert_eq!(
        e.to_string(),
        "allocation of 2 GiB refused: container uses 3 GiB of its 4 GiB limit"
    );
    assert_eq!(
        r.container_used(dev),
        3 * G,
        "a refused reservation is rolled back"
    );
    r.try_charge(s, dev, G, Some(4 * G)).unwrap();
    assert!(
        r.try_charge(s, dev, 1, Some(4 * G)).is_err(),
        "exactly at the limit, not one byte more"
    );
    assert!(r.try_charge(s, dev, 5 * G, Some(4 * G)).is_err());
}

#[test]
fn concurrent_charging_never_exceeds_the_cap_and_totals_are_exact() {
    let f = TempFile::new("concurrent");
    let r = Arc::new(UsageRegion::open(f.path()).unwrap());
    let dev = r.device(&UUID_A).unwrap();
    let limit = 64 * (1 << 20);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    // Bytes admitted and not yet returned, as the threads see it (a lower bound of the true amount: raised
    // after a charge succeeds, lowered before the uncharge). `container_used` itself may exceed the cap for an
    // instant, by reservations about to be rolled back; what is admitted must not.
    let admitted = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let r = r.clone();
            let barrier = barrier.clone();
            let admitted = admitted.clone();
            std::thread::spawn(move || {
                let slot = r.claim_slot().unwrap();
                barrier.wait();
                let mut held: Vec<u64> = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if matches!(x % 3, 0) && !held.is_empty() {
                        let b = held.swap_remove((x as usize / 3) % held.len());
                        admitted.fetch_sub(b, Ordering::SeqCst);
                        assert_eq!(r.uncharge(slot, dev, b), b);
                    } else {
                        let b = (x >> 20) % (4 << 20) + 1;
                        if r.try_charge(slot, dev, b, Some(limit)).is_ok() {
                            held.push(b);
                            let now = admitted.fetch_add(b, Ordering::SeqCst) + b;
                            assert!(now <= limit, "cap exceeded: {now} > {limit}");
                        }
                    }
                }
                (slot, held.iter().sum::<u64>())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let total: u64 = results.iter().map(|(_, b)| b).sum();
    assert_eq!(r.container_used(dev), total, "exact totals");
    for (slot, held) in &results {
        assert_eq!(r.slot_used(*slot, dev), *held);
    }
    assert!(total <= limit);
}

#[test]
fn two_mappings_in_one_process_behave_like_two_processes() {
    let f = TempFile::new("two-maps");
    let a = UsageRegion::open(f.path()).unwrap();
    let b = UsageRegion::open(f.path()).unwrap();
    let (sa, sb) = (a.process_slot().unwrap(), b.process_slot().unwrap());
    assert_ne!(sa, sb);
    let (da, db) = (a.device(&UUID_A).unwrap(), b.device(&UUID_A).unwrap());
    assert_eq!(da, db, "one entry per UUID");
    a.try_charge(sa, da, 3 * G, Some(4 * G)).unwrap();
    assert_eq!(b.container_used(db), 3 * G);
    assert!(
        b.try_charge(sb, db, 2 * G, Some(4 * G)).is_err(),
        "a's usage counts against b"
    );
    b.try_charge(sb, db, G, Some(4 * G)).unwrap();
    assert_eq!(a.container_used(da), 4 * G);
    assert_eq!(b.device(&UUID_B).unwrap(), a.find_device(&UUID_B).unwrap());
}

#[test]
fn racing_device_claims_give_one_entry_per_uuid() {
    let f = TempFile::new("devices");
    let threads = 16;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let path = f.path().to_path_buf();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let r = UsageRegion::open(&path).unwrap(); // racing creation, too
                let mut uuid = [0u8; 16];
                uuid[0] = (t % 4) as u8 + 1;
                (uuid[0], r.device(&uuid).unwrap())
            })
        })
        .collect();
    let mut seen = std::collections::BTreeMap::new();
    for h in handles {
        let (k, d) = h.join().unwrap();
        assert_eq!(*seen.entry(k).or_insert(d), d, "uuid {k} got two entries");
    }
    let r = UsageRegion::open(f.path()).unwrap();
    assert_eq!(r.devices().len(), 4);
}

#[test]
fn sigkilled_child_usage_is_reclaimed() {
    let f = TempFile::new("sigkill");
    let r = UsageRegion::open(f.path()).unwrap();
    let mut child = spawn_child("charge-and-wait", f.path());
    wait_ready(&mut child);
    let dev = r.find_device(&UUID_A).unwrap();
    assert_eq!(r.container_used(dev), G);
    let procs = r.processes();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, child.id());
    assert!(r.is_member(child.id()));

    let me = r.process_slot().unwrap();
    assert!(
        r.try_charge(me, dev, 3 * G / 2, Some(2 * G)).is_err(),
        "child holds 1 GiB of 2"
    );
    assert_eq!(r.reclaim_dead(), 0, "a live child is not reclaimed");

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // charge() reclaims the dead child's slot on its slow path, then admits.
    r.charge(me, dev, 3 * G / 2, Some(2 * G)).unwrap();
    assert_eq!(r.container_used(dev), 3 * G / 2);
    assert!(!r.is_member(child.id()));
    assert_eq!(r.processes().len(), 1);
}

/// A reader outside the container (the agent) counts a killed process's charge, not yet reclaimed, as dead
/// by its released lock (`dead_held`); a live one's is not.
#[test]
fn a_killed_processs_charge_reads_as_dead_until_reclaimed() {
    let f = TempFile::new("deadheld");
    let r = UsageRegion::open(f.path()).unwrap();
    let mut child = spawn_child("charge-and-wait", f.path());
    wait_ready(&mut child);
    let dev = r.find_device(&UUID_A).unwrap();
    assert_eq!(r.dead_held(dev), 0, "a live child's charge read as dead");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(r.container_used(dev), G, "not reclaimed yet");
    assert_eq!(r.dead_held(dev), G);
    assert_eq!(r.reclaim_dead(), 1);
    assert_eq!(r.dead_held(dev), 0);
}

/// Seen from another pid namespace, a slot's pid names nobody (or someone else): the owner's liveness lock,
/// not its pid, keeps its slot. Modelled by rewriting the child's recorded pid to one that does not exist here.
#[test]
fn a_live_owner_is_kept_by_its_lock_whatever_its_pid_says() {
    use std::os::unix::fs::FileExt;
    let f = TempFile::new("nspid");
    let r = UsageRegion::open(f.path()).unwrap();
    let mut child = spawn_child("charge-and-wait", f.path());
    wait_ready(&mut child);
    let dev = r.find_device(&UUID_A).unwrap();
    let slot = r.processes()[0].slot;
    let owner_off = (64 + 144 * layout::MAX_DEVICES + 320 * slot.index()) as u64;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(f.path())
        .unwrap();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, owner_off).unwrap();
    let w = u64::from_ne_bytes(word);
    assert_eq!(layout::owner_pid(w), child.id());
    let elsewhere = layout::owner_word(
        i32::MAX as u32 - 7,
        layout::owner_state(w),
        layout::owner_generation(w),
    );
    file.write_all_at(&elsewhere.to_ne_bytes(), owner_off).unwrap();

    assert!(r.slot_alive(slot), "the lock is held: alive");
    assert_eq!(
        r.reclaim_dead(),
        0,
        "a live owner with a foreign pid was reclaimed"
    );
    assert_eq!(r.container_used(dev), G);

    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !r.slot_alive(slot),
        "the kernel dropped the lock with the process"
    );
    assert_eq!(r.reclaim_dead(), 1);
    assert_eq!(r.container_used(dev), 0);
}

#[test]
fn a_released_slot_drops_its_lock_and_a_forked_child_keeps_none() {
    let f = TempFile::new("unlock");
    let r = UsageRegion::open(f.path()).unwrap();
    let watcher = UsageRegion::open(f.path()).unwrap();
    let slot = r.process_slot().unwrap();
    assert!(watcher.slot_alive(slot));
    r.release_process_slot();
    assert!(!watcher.slot_alive(slot), "freed");
    // Claimed again, then the child-side fork handler runs here (as in a forked child): the process forgets
    // the slot and its lock descriptor; with no other descriptor left, the lock goes (in a real fork the
    // parent's descriptor keeps it).
    let slot = r.process_slot().unwrap();
    assert!(watcher.slot_alive(slot));
    r.forget_slot_in_child();
    assert!(!watcher.slot_alive(slot));
    assert_eq!(watcher.reclaim_dead(), 1);
}

#[test]
fn many_processes_create_and_join_at_once() {
    let f = TempFile::new("herd");
    // 300 processes starting at once (HAMi-core takes ~60 s for this); CQ_TEST_HERD overrides.
    let n: usize = std::env::var("CQ_TEST_HERD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut children: Vec<Child> = (0..n)
        .map(|_| spawn_child("open-claim-charge", f.path()))
        .collect();
    for c in &mut children {
        wait_ready(c);
    }
    let r = UsageRegion::open_existing(f.path()).unwrap();
    let devs = r.devices();
    assert_eq!(devs.len(), 2, "racing creators agreed on one entry per UUID");
    for d in devs {
        assert_eq!(d.used, n as u64 * (1 << 20));
    }
    assert_eq!(r.processes().len(), n);
    for c in &mut children {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    assert_eq!(r.reclaim_dead(), n);
    assert!(r.devices().iter().all(|d| d.used == 0));
}

#[test]
fn slots_exhausted_then_recovered_by_reclaim() {
    let f = TempFile::new("exhaust");
    let r = UsageRegion::open(f.path()).unwrap();
    for _ in 0..MAX_PROCS {
        r.claim_slot().unwrap();
    }
    assert!(matches!(r.claim_slot(), Err(RegionError::SlotsExhausted { .. })));
    // a dead-pid slot gets reclaimed by the claim's second pass
    let r2 = UsageRegion::open(f.path()).unwrap();
    let first = r2.processes()[0].slot;
    r2.release_slot(first);
    assert!(r.claim_slot_as(i32::MAX as u32 - 2, 1).is_ok());
    // Another test of this binary forking a child (fork, then exec) holds every open file description for a
    // moment, so the slot lock this process just dropped can still look held: retry for a while, not forever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let claimed = loop {
        match r.claim_slot() {
            Ok(s) => break Some(s),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(_) => break None,
        }
    };
    assert!(
        claimed.is_some(),
        "the dead pid's slot was reclaimed on the second pass"
    );
}

#[test]
fn shared_memory_counts_once_until_its_last_holder_goes() {
    let f = TempFile::new("shared");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let exporter = r.claim_slot().unwrap();
    // A holder whose process is gone (reclaimed below).
    let importer = r.claim_slot_as(i32::MAX as u32 - 3, 1).unwrap();
    r.try_charge(exporter, dev, G, None).unwrap();
    // The exporter's charge moves into the entry: the container's usage is unchanged.
    let (i, moved) = r.share(exporter, dev, 42, G).unwrap();
    assert!(moved);
    assert_eq!(r.slot_used(exporter, dev), 0);
    assert_eq!(r.container_used(dev), G);
    // Sharing the same key again (a second handle for the allocation) joins, moves nothing.
    assert_eq!(r.share(exporter, dev, 42, G), Some((i, false)));
    // An importer joins: still one charge.
    assert_eq!(r.join_shared(importer, 42), Some(i));
    assert_eq!(
        r.join_shared(importer, 7),
        None,
        "an unknown key is not this container's"
    );
    assert_eq!(r.container_used(dev), G);
    // The exporter lets go: the importer still holds it.
    r.unshare(exporter, i, 42);
    assert_eq!(r.container_used(dev), G);
    assert_eq!(r.shared(), vec![(42, dev.index(), G, 1)]);
    // The importer dies: its hold goes with its slot, and the memory with its last holder.
    assert_eq!(r.reclaim_dead(), 1);
    assert_eq!(r.container_used(dev), 0);
    assert!(r.shared().is_empty());
    assert_eq!(r.join_shared(exporter, 42), None);
}

#[test]
fn a_full_shared_table_refuses() {
    let f = TempFile::new("shared-full");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let s = r.claim_slot().unwrap();
    for k in 0..layout::MAX_SHARED as u64 {
        assert!(r.share(s, dev, 100 + k, 1).is_some());
    }
    assert_eq!(r.share(s, dev, 1, 1), None);
    // A released slot drops every hold.
    r.release_slot(s);
    assert_eq!(r.container_used(dev), 0);
    assert!(r.shared().is_empty());
}

/// The bind command's open (`UsageRegion::open_for_binding`): no symbolic link in any component, never
/// blocking on a FIFO, `..` and relative paths resolved without links; the identity is the opened file's.
#[test]
fn opening_for_binding_follows_no_link_and_never_blocks() {
    use cuquota_core::region::{RegionError, UsageRegion};
    let base = TempFile::new("bindopen");
    let real = base.path().join("real");
    std::fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, base.path().join("link")).unwrap();

    let direct = real.join("usage");
    let u = UsageRegion::open_for_binding(&direct, true).expect("created");
    assert_eq!(
        u.file_id(),
        UsageRegion::open(&direct).unwrap().file_id(),
        "the opened file's identity"
    );
    let dotted = base.path().join("real/../real/./usage");
    UsageRegion::open_for_binding(&dotted, false).expect("`..` and `.` are no links");

    for (p, create) in [
        (base.path().join("link/usage"), false),
        (base.path().join("link/new"), true),
    ] {
        let e = UsageRegion::open_for_binding(&p, create).expect_err("through a link");
        assert!(
            matches!(&e, RegionError::SymlinkInPath { link, .. } if link == &base.path().join("link")),
            "{e}"
        );
        assert!(!real.join("new").exists(), "created through a link");
    }
    std::os::unix::fs::symlink(&direct, real.join("last")).unwrap();
    assert!(matches!(
        UsageRegion::open_for_binding(&real.join("last"), false),
        Err(RegionError::SymlinkInPath { .. })
    ));

    let fifo = real.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    for create in [false, true] {
        assert!(matches!(
            UsageRegion::open_for_binding(&fifo, create),
            Err(RegionError::NotRegularFile { .. })
        ));
    }
    std::fs::remove_dir_all(base.path()).unwrap();
}

/// Credit (a slot's charge taken ahead of its allocations): charged within the limit, taken by its owner only
/// while it holds that much, trimmed above `max`, reported as free, and taken back by anyone.
#[test]
fn credit_is_charged_taken_trimmed_and_taken_back() {
    let f = TempFile::new("credit");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let a = r.claim_slot().unwrap();
    let b = r.claim_slot_as(current_pid(), current_start_time()).unwrap();
    const M: u64 = 1 << 20;
    assert!(!r.take_credit(a, dev, 1), "no credit before a charge");
    assert!(r.charge_credit(a, dev, 16 * M, G));
    assert!(
        !r.charge_credit(b, dev, G, G),
        "credit is charged within the limit"
    );
    assert_eq!(r.container_used(dev), 16 * M);
    assert_eq!(r.container_held(dev), 0, "credit is not held");
    assert!(r.take_credit(a, dev, 10 * M));
    assert!(!r.take_credit(a, dev, 7 * M), "6 MiB left");
    assert_eq!(r.container_held(dev), 10 * M);
    r.try_charge(a, dev, 40 * M, Some(G)).unwrap();
    // Its 50 MiB of allocations freed into the credit: 56 MiB is over the 32 MiB most, so back to one chunk.
    assert!(r.give_credit(a, dev, 50 * M, 16 * M));
    assert_eq!(
        r.container_used(dev),
        16 * M,
        "the excess over one chunk was uncharged"
    );
    assert_eq!(r.container_held(dev), 0);
    r.charge(b, dev, 100 * M, Some(G)).unwrap();
    assert_eq!(r.drain_all_credit(dev), 16 * M, "anyone takes credit back");
    assert_eq!(r.container_used(dev), 100 * M);
    assert!(!r.take_credit(a, dev, 1));
}

/// A credit word above `CREDIT_MAX` was not written by its owner: it is not taken from, not uncharged when
/// taken back, and not reported free; a live slot that does not know credit (a process of a version before
/// it) stops anyone from charging credit, and its words are not read.
#[test]
fn forged_credit_and_slots_that_do_not_know_credit() {
    let f = TempFile::new("credit-forged");
    let r = UsageRegion::open(f.path()).unwrap();
    let dev = r.device(&UUID_A).unwrap();
    let a = r.claim_slot().unwrap();
    const M: u64 = 1 << 20;
    r.try_charge(a, dev, 100 * M, Some(G)).unwrap();
    let slot_off =
        std::mem::offset_of!(layout::UsageFile, slots) + a.index() * std::mem::size_of::<layout::UsageSlot>();
    let credit_off = slot_off + std::mem::offset_of!(layout::UsageSlot, credit);
    let flags_off = slot_off + std::mem::offset_of!(layout::UsageSlot, flags);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(f.path())
        .unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&(8 * G).to_ne_bytes(), credit_off as u64)
        .unwrap();
    assert!(!r.take_credit(a, dev, M), "a forged word is not credit");
    assert_eq!(
        r.container_held(dev),
        100 * M - layout::CREDIT_MAX,
        "read as at most CREDIT_MAX"
    );
    assert_eq!(r.drain_all_credit(dev), 0, "nothing uncharged for it");
    assert_eq!(r.container_used(dev), 100 * M);
    // The slot now says it does not know credit (as a process of an earlier version): nobody charges credit.
    let b = r.claim_slot_as(current_pid(), current_start_time()).unwrap();
    file.write_all_at(&1u32.to_ne_bytes(), flags_off as u64).unwrap();
    assert!(
        !r.charge_credit(b, dev, 16 * M, G),
        "a live slot that does not know credit"
    );
    file.write_all_at(&(16 * M).to_ne_bytes(), credit_off as u64)
        .unwrap();
    assert_eq!(r.container_held(dev), 100 * M, "its words are not read");
}
