//! `include/cuquota.h` must describe exactly the layout `core/src/region/layout.rs` defines: this test compiles
//! a C program against the header that prints every struct size, field offset, field size and constant, and
//! compares the lot with the Rust definitions (both directions: a field missing on either side fails).

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use cuquota_core::region::layout::*;

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! fields {
    ($map:ident, $rust:ty, $c:literal, [$($f:ident),* $(,)?]) => {
        $map.insert(format!("sizeof {}", $c), size_of::<$rust>() as u64);
        $(
            $map.insert(format!("{}.{} offset", $c, stringify!($f)), offset_of!($rust, $f) as u64);
            $map.insert(format!("{}.{} size", $c, stringify!($f)), field_size(|s: &$rust| &s.$f) as u64);
        )*
    };
}

fn rust_layout() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    fields!(
        m,
        LimitsHeader,
        "cuquota_limits_header",
        [
            magic,
            abi_version,
            header_size,
            total_size,
            max_devices,
            flags,
            seq,
            generation,
            writer_pid,
            _reserved0,
            evict_mask,
        ]
    );
    fields!(
        m,
        PolicyWords,
        "cuquota_policy",
        [memory_limit, reserved_memory, sm_limit, policy, weight, priority]
    );
    fields!(
        m,
        LimitsEntry,
        "cuquota_limits_entry",
        [uuid, flags, cuda_index, limits, memory_request]
    );
    fields!(
        m,
        LimitsMembers,
        "cuquota_limits_members",
        [count, _reserved0, pids]
    );
    fields!(
        m,
        LimitsUsage,
        "cuquota_limits_usage",
        [len, _reserved0, path, dev, ino, btime_ns]
    );
    fields!(
        m,
        LimitsFile,
        "cuquota_limits_file",
        [header, devices, members, usage]
    );
    fields!(
        m,
        UsageHeader,
        "cuquota_usage_header",
        [
            magic,
            abi_version,
            header_size,
            total_size,
            max_devices,
            max_procs,
            proc_high_water,
            shared_high_water,
            last_use_ns,
            waiting,
            _reserved,
        ]
    );
    fields!(
        m,
        UsageDevice,
        "cuquota_usage_device",
        [uuid, owner, limits, throttle, busy_ns, throttled_ns, refusals]
    );
    fields!(
        m,
        UsageSlot,
        "cuquota_usage_slot",
        [owner, start_time, host_pid, flags, mem_used, gpu_ns, credit,]
    );
    fields!(
        m,
        UsageShared,
        "cuquota_usage_shared",
        [key, bytes, device, holders, holder_slots, _reserved]
    );
    fields!(
        m,
        UsageFile,
        "cuquota_usage_file",
        [header, devices, slots, shared]
    );
    fields!(
        m,
        PriorityHeader,
        "cuquota_priority_header",
        [
            magic,
            abi_version,
            header_size,
            total_size,
            max_devices,
            inflight_slots,
            _reserved,
        ]
    );
    fields!(
        m,
        PriorityDevice,
        "cuquota_priority_device",
        [
            uuid,
            owner,
            hp_last_launch,
            hp_busy_until,
            hp_launches,
            be_token,
            be_launches,
            be_waits,
            be_waited_ns,
            inflight,
            reserve_refusals,
            _reserved,
        ]
    );
    fields!(m, PriorityFile, "cuquota_priority_file", [header, devices]);
    let consts: [(&str, u64); 34] = [
        ("CUQUOTA_LIMITS_MAGIC", LIMITS_MAGIC),
        ("CUQUOTA_USAGE_MAGIC", USAGE_MAGIC),
        ("CUQUOTA_ABI_VERSION", ABI_VERSION.into()),
        ("CUQUOTA_MAX_DEVICES", MAX_DEVICES as u64),
        ("CUQUOTA_MAX_PROCS", MAX_PROCS as u64),
        ("CUQUOTA_CREDIT_DEVICES", CREDIT_DEVICES as u64),
        ("CUQUOTA_MAX_SHARED", MAX_SHARED as u64),
        ("CUQUOTA_SHARED_CLAIMING", SHARED_CLAIMING),
        ("CUQUOTA_THROTTLE_WORDS", THROTTLE_WORDS as u64),
        ("CUQUOTA_ENTRY_VALID", LIMITS_ENTRY_VALID.into()),
        ("CUQUOTA_INDEX_ALL", LIMITS_INDEX_ALL.into()),
        ("CUQUOTA_FLAG_NO_OPT_OUT", LIMITS_FLAG_NO_OPT_OUT.into()),
        ("CUQUOTA_FLAG_MEMBERS", LIMITS_FLAG_MEMBERS.into()),
        ("CUQUOTA_FLAG_OPT_OUT_ALLOWED", LIMITS_FLAG_OPT_OUT_ALLOWED.into()),
        ("CUQUOTA_FLAG_RECLAIM", LIMITS_FLAG_RECLAIM.into()),
        ("CUQUOTA_MAX_MEMBERS", LIMITS_MAX_MEMBERS as u64),
        ("CUQUOTA_USAGE_PATH_MAX", LIMITS_USAGE_PATH_MAX as u64),
        ("CUQUOTA_POLICY_DEFAULT", POLICY_DEFAULT.into()),
        ("CUQUOTA_POLICY_HARD", POLICY_HARD.into()),
        ("CUQUOTA_POLICY_BURST", POLICY_BURST.into()),
        ("CUQUOTA_POLICY_DISABLED", POLICY_DISABLED.into()),
        ("CUQUOTA_PRIORITY_NONE", PRIORITY_NONE.into()),
        ("CUQUOTA_PRIORITY_HIGH", PRIORITY_HIGH.into()),
        ("CUQUOTA_PRIORITY_LOW", PRIORITY_LOW.into()),
        ("CUQUOTA_STATE_FREE", STATE_FREE.into()),
        ("CUQUOTA_STATE_CLAIMING", STATE_CLAIMING.into()),
        ("CUQUOTA_STATE_LIVE", STATE_LIVE.into()),
        ("CUQUOTA_STATE_RECLAIMING", STATE_RECLAIMING.into()),
        ("CUQUOTA_SLOT_LOCKED", SLOT_FLAG_LOCKED.into()),
        ("CUQUOTA_SLOT_CREDIT", SLOT_FLAG_CREDIT.into()),
        ("CUQUOTA_CREDIT_MAX", CREDIT_MAX),
        ("CUQUOTA_SLOT_LOCK_OFFSET(7)", slot_lock_offset(7)),
        (
            "CUQUOTA_OWNER(123456, 3, 0xabcdef)",
            owner_word(123456, 3, 0xab_cdef),
        ),
        (
            "CUQUOTA_OWNER_GEN(CUQUOTA_OWNER(1, 2, 0x1000005))",
            owner_generation(owner_word(1, 2, 0x100_0005)).into(),
        ),
    ];
    let priority_consts: [(&str, u64); 4] = [
        ("CUQUOTA_PRIORITY_MAGIC", PRIORITY_MAGIC),
        ("CUQUOTA_PRIORITY_ABI_VERSION", PRIORITY_ABI_VERSION.into()),
        ("CUQUOTA_PRIORITY_INFLIGHT", PRIORITY_INFLIGHT as u64),
        (
            "CUQUOTA_INFLIGHT(123, 0xfedcba98)",
            inflight_word(123, 0xfedc_ba98),
        ),
    ];
    for (k, v) in consts.into_iter().chain(priority_consts) {
        m.insert(format!("const {k}"), v);
    }
    m
}

fn c_program() -> String {
    let mut body = String::new();
    for (k, _) in rust_layout() {
        let expr = if let Some(s) = k.strip_prefix("sizeof ") {
            format!("(unsigned long long)sizeof(struct {s})")
        } else if let Some(c) = k.strip_prefix("const ") {
            format!("(unsigned long long)({c})")
        } else {
            let (path, what) = k.rsplit_once(' ').unwrap();
            let (s, f) = path.split_once('.').unwrap();
            if what == "offset" {
                format!("(unsigned long long)offsetof(struct {s}, {f})")
            } else {
                format!("(unsigned long long)sizeof(((struct {s} *)0)->{f})")
            }
        };
        body.push_str(&format!("    printf(\"%s=%llu\\n\", \"{k}\", {expr});\n"));
    }
    format!("#include <stddef.h>\n#include <stdio.h>\n#include \"cuquota.h\"\nint main(void) {{\n{body}    return 0;\n}}\n")
}

#[test]
fn c_header_matches_rust_layout() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let include = root.join("include");
    let dir = std::env::temp_dir().join(format!("cuquota-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "header does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let c: BTreeMap<String, u64> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let rust = rust_layout();
    let mismatches: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: rust {v}, C {:?}", c.get(k)))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        mismatches.is_empty(),
        "include/cuquota.h and layout.rs disagree:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(c.len(), rust.len());
}

#[test]
fn every_header_struct_field_is_checked() {
    // Catch a field added to the C header but not to this test (and so possibly not to Rust): count the
    // members declared in each struct of the header and compare with the fields listed above.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let header = std::fs::read_to_string(root.join("include/cuquota.h")).unwrap();
    let rust = rust_layout();
    let mut structs = 0;
    let mut current: Option<(String, usize)> = None;
    for line in header.lines() {
        let code = line.split("/*").next().unwrap().trim_end();
        if let Some(name) = code.strip_prefix("struct ").and_then(|r| r.strip_suffix(" {")) {
            current = Some((name.to_string(), 0));
        } else if code == "};" {
            let (name, members) = current.take().expect("}; outside a struct");
            structs += 1;
            let listed = rust
                .keys()
                .filter(|k| k.starts_with(&format!("{name}.")) && k.ends_with(" offset"))
                .count();
            assert_eq!(
                members, listed,
                "struct {name}: {members} members in the header, {listed} checked"
            );
        } else if let Some((_, members)) = current.as_mut() {
            if code.ends_with(';') {
                *members += 1;
            }
        }
    }
    assert_eq!(structs, 14, "structs found in the header");
}
