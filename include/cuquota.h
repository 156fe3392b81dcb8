/*
 * cuquota.h — layout of cuquota's shared region files, for node agents and tools written in C.
 *
 * Mirrors core/src/region/layout.rs field for field; core/tests/header.rs compiles this header and checks every
 * size and offset against the Rust definitions. Bump CUQUOTA_ABI_VERSION on any change.
 *
 * Every field is accessed atomically (C11 <stdatomic.h> on these fixed-width fields, or __atomic builtins):
 * other processes read and write them concurrently. All integers are native-endian. UUIDs are the 16 raw
 * bytes in order (memcpy them in; `uuid[i]` as a u64 is the native-endian load of bytes 8i..8i+8).
 *
 * ---------------------------------------------------------------------------------------------------------
 * LIMITS FILE (default /etc/cuquota/limits; the agent writes it, containers mount it read-only)
 *
 *   Size: sizeof(struct cuquota_limits_file). Create it zero-filled at that size, then initialise the header:
 *   abi_version, header_size, total_size, max_devices, and the magic LAST (release store). Or run
 *   `cuquota limits init <file>`.
 *
 *   Write protocol (seqlock; writer_pid is the writers' lock, so one writer at a time):
 *     1. w = load_acquire(writer_pid). If w is 0, or kill(w, 0) fails with ESRCH (its writer died): CAS
 *        writer_pid w -> getpid(); on failure, or if w is a live process, wait and start over.
 *     2. s = load_acquire(seq). If s is even: store_release(seq, s+1) and s_odd = s+1. If s is odd, a writer
 *        died mid-write: s_odd = s (finish its write). atomic_thread_fence(release).
 *     3. write the fields (relaxed atomic stores): header flags, entries, members.
 *     4. generation += 1; store_release(seq, s_odd + 1); store_release(writer_pid, 0).
 *   The pid is recorded before anything changes, so a live writer is never taken over and a dead one always is.
 *   Readers never wait on a writer: they retry a bounded number of times and keep their last good copy.
 *
 *   Read protocol: s1 = load_acquire(seq); if odd, retry; copy fields (relaxed); atomic_thread_fence(acquire);
 *   s2 = load_relaxed(seq); s1 == s2 -> consistent.
 *
 *   Usage binding (usage.len != 0): a process opens usage.path (never creating it) and refuses it unless its
 *   statx identity is usage.dev/ino/btime_ns (when ino != 0): a file put at the path after the agent bound it is
 *   not the container's file. An agent records the identity of the file itself (statx with STATX_INO |
 *   STATX_BTIME; btime_ns 0 when stx_mask lacks STATX_BTIME).
 *
 *   Entry matching for a device: a valid entry with its UUID; else a valid entry with an all-zero uuid and
 *   cuda_index == the device's CUDA ordinal; else a valid entry with all-zero uuid and cuda_index ==
 *   CUQUOTA_INDEX_ALL. The shim applies min(its own env/config limit, the entry's limit).
 *
 * ---------------------------------------------------------------------------------------------------------
 * USAGE FILE (default /tmp/cuquota.usage; shared read-write by one container's processes)
 *
 *   Created by whichever process finds it missing (O_EXCL, mode 0666), extended to its size by whoever finds
 *   it empty, header initialised by whoever finds magic == 0 (all write the same values; magic last).
 *
 *   Owner words (slots and device entries): CUQUOTA_OWNER(pid, state, generation); every transition is one CAS
 *   on the whole word with generation + 1.
 *   Slot:   [lock byte CUQUOTA_SLOT_LOCK_OFFSET(i) with F_OFD_SETLK on a descriptor of its own; busy = a live
 *           process holds the slot] FREE -> CLAIMING(pid) -> [write start_time, zero counters, flags =
 *           CUQUOTA_SLOT_LOCKED, raise proc_high_water] -> LIVE(pid). Keep the lock while the slot is yours.
 *           Dead owner: if flags has CUQUOTA_SLOT_LOCKED, the lock byte is free (F_OFD_GETLK from another open
 *           file description says F_UNLCK) — valid across pid namespaces; else (no lock) kill(pid, 0) ESRCH,
 *           zombie, or /proc/<pid>/stat field 22 != start_time. Anyone then CASes LIVE -> RECLAIMING(own
 *           pid), zeroes the counters, then CASes RECLAIMING -> FREE. A clean exit does the same for its own.
 *   Device: FREE -> CLAIMING(pid) -> [write uuid] -> LIVE. Never freed. Scanners wait for a CLAIMING entry (or
 *           take it over if its claimer is dead) so a UUID never gets two entries.
 *   Admission of n bytes on device d: fetch_add(slot.mem_used[d], n); sum mem_used[d] over slots
 *   [0, proc_high_water); if sum > limit: fetch_sub(n) and refuse. Sequentially consistent atomics.
 *   Tools that only read (status) may read any field with relaxed loads.
 *
 * ---------------------------------------------------------------------------------------------------------
 * PRIORITY FILES (CUQUOTA_PRIORITY_ABI_VERSION 5; docs/priority.md). One file per container with a priority,
 * in a node directory the agent owns: NAME.high for a high-priority container, anything else is not high. The
 * directory is mounted read-only into every such container at <own file>.d (default /etc/cuquota/priority.d),
 * and the container's own file read-write at /etc/cuquota/priority (or CUQUOTA_PRIORITY_FILE). A container
 * writes only its own file; best-effort tenants trust the high-priority words of *.high files only.
 *
 *   Header initialised like the usage file's (magic CUQUOTA_PRIORITY_MAGIC last). Device entries are claimed
 *   by UUID exactly like usage device entries. Times are CLOCK_MONOTONIC ns; a time more than 10 s ahead of
 *   now is garbage (ignored, overwritten). High-priority launches store hp_last_launch = now and raise
 *   hp_busy_until to their estimated drain time. be_token (the container's own): 0 = free, else the time its
 *   holder's kernel is presumed done; taken by CAS when 0, expired or garbage, released by CAS(value, 0).
 *   inflight[i]: CUQUOTA_INFLIGHT(mib, expiry second), claimed by CAS from 0 or expired, released by
 *   CAS(word, 0); readers sum the live words of every file in the directory.
 */
#ifndef CUQUOTA_H
#define CUQUOTA_H

#include <stdint.h>

#define CUQUOTA_LIMITS_MAGIC 0x54494d494c515543ULL /* "CUQLIMIT" as little-endian bytes */
#define CUQUOTA_USAGE_MAGIC 0x4547415355515543ULL  /* "CUQUSAGE" as little-endian bytes */
#define CUQUOTA_ABI_VERSION 4u
#define CUQUOTA_MAX_DEVICES 16
#define CUQUOTA_MAX_PROCS 1024
#define CUQUOTA_CREDIT_DEVICES 5
#define CUQUOTA_CREDIT_MAX (32ull << 20) /* a credit word above it is not credit (tampered) */
#define CUQUOTA_MAX_SHARED 256
#define CUQUOTA_SHARED_CLAIMING 0xffffffffffffffffULL
#define CUQUOTA_THROTTLE_WORDS 8
#define CUQUOTA_MAX_MEMBERS 1024
#define CUQUOTA_USAGE_PATH_MAX 480

/* Limits entry flags / cuda_index / header flags / policy / priority. */
#define CUQUOTA_ENTRY_VALID 1u
#define CUQUOTA_INDEX_ALL 0xffffffffu
#define CUQUOTA_FLAG_NO_OPT_OUT 1u
#define CUQUOTA_FLAG_MEMBERS 2u /* the agent publishes members (struct cuquota_limits_members) */
#define CUQUOTA_FLAG_OPT_OUT_ALLOWED 4u /* processes may opt out; clear (default) or NO_OPT_OUT set = they may not */
#define CUQUOTA_FLAG_RECLAIM 8u /* the agent reclaims device memory for waiting allocations */
#define CUQUOTA_POLICY_DEFAULT 0u
#define CUQUOTA_POLICY_HARD 1u
#define CUQUOTA_POLICY_BURST 2u
#define CUQUOTA_POLICY_DISABLED 3u
#define CUQUOTA_PRIORITY_NONE 0u
#define CUQUOTA_PRIORITY_HIGH 1u /* HAMi CUDA_TASK_PRIORITY=0 */
#define CUQUOTA_PRIORITY_LOW 2u  /* HAMi CUDA_TASK_PRIORITY=1 (best effort) */

/* Owner-word states and packing: bits 0-31 pid, 32-39 state, 40-63 generation. */
#define CUQUOTA_STATE_FREE 0u
#define CUQUOTA_STATE_CLAIMING 1u
#define CUQUOTA_STATE_LIVE 2u
#define CUQUOTA_STATE_RECLAIMING 3u
/* Slot flags: the owner holds an open-file-description lock (F_OFD_SETLK, F_WRLCK, 1 byte) on the usage file at
 * offset CUQUOTA_SLOT_LOCK_OFFSET(slot); the kernel drops it when the owner dies. */
#define CUQUOTA_SLOT_LOCKED 1u
#define CUQUOTA_SLOT_CREDIT 2u /* the owner knows credit[] (takes it back before refusing) */
#define CUQUOTA_SLOT_LOCK_OFFSET(slot) ((uint64_t)sizeof(struct cuquota_usage_file) + (uint64_t)(slot))
#define CUQUOTA_OWNER(pid, state, gen)                                                                      \
    ((uint64_t)(uint32_t)(pid) | ((uint64_t)((state) & 0xffu) << 32) | ((uint64_t)((gen) & 0xffffffu) << 40))
#define CUQUOTA_OWNER_PID(w) ((uint32_t)(w))
#define CUQUOTA_OWNER_STATE(w) ((uint32_t)(((w) >> 32) & 0xffu))
#define CUQUOTA_OWNER_GEN(w) ((uint32_t)((w) >> 40))

struct cuquota_limits_header {
    uint64_t magic;       /* CUQUOTA_LIMITS_MAGIC, stored last */
    uint32_t abi_version; /* CUQUOTA_ABI_VERSION */
    uint32_t header_size; /* sizeof(struct cuquota_limits_header) */
    uint64_t total_size;  /* sizeof(struct cuquota_limits_file) */
    uint32_t max_devices; /* CUQUOTA_MAX_DEVICES */
    uint32_t flags;       /* CUQUOTA_FLAG_*; seqlock-protected */
    uint64_t seq;         /* seqlock: odd while a write is in progress */
    uint64_t generation;  /* committed writes; seqlock-protected */
    uint32_t writer_pid;  /* pid holding the write side, 0 = none */
    uint32_t _reserved0;
    uint64_t evict_mask;  /* elastic memory: bit i = move movable memory above the request to host memory on
                             the devices of entry i while quiescent; 0 = no ask; seqlock-protected */
};

/* A device's limits: in limits entries (the agent's word) and usage device entries (what a process enforces). */
struct cuquota_policy {
    uint64_t memory_limit;    /* bytes, 0 = none */
    uint64_t reserved_memory; /* bytes kept free for high-priority tenants, 0 = none */
    uint32_t sm_limit;        /* percent, 0 (or >= 100) = none */
    uint32_t policy;          /* CUQUOTA_POLICY_* */
    uint32_t weight;          /* burst weight 1-1000, 0 = default */
    uint32_t priority;        /* CUQUOTA_PRIORITY_* */
};

struct cuquota_limits_entry {
    uint64_t uuid[2];             /* raw UUID bytes; all zero = match by cuda_index */
    uint32_t flags;               /* CUQUOTA_ENTRY_VALID */
    uint32_t cuda_index;          /* CUDA ordinal, or CUQUOTA_INDEX_ALL */
    struct cuquota_policy limits; /* the limits */
    uint64_t memory_request;      /* guaranteed bytes, 0 = none (= the limit); zero (reserved) in older files */
};

/* The container's processes as the agent sees them: host pids (as NVML reports them), sorted ascending, no
 * duplicates, pids[count..] zero. Seqlock-protected; meaningful only while header.flags has
 * CUQUOTA_FLAG_MEMBERS (clear: no agent membership, the shim falls back to the usage file's list). */
struct cuquota_limits_members {
    uint32_t count; /* valid entries of pids, <= CUQUOTA_MAX_MEMBERS */
    uint32_t _reserved0;
    uint32_t pids[CUQUOTA_MAX_MEMBERS];
};

/* The container's usage file as its processes see it; processes under the limits file use it whatever their
 * environment says. len 0 = not bound. dev/ino/btime_ns: the bound file's identity (statx of the file as the
 * agent sees it); a process refuses a file at `path` that is another one. ino 0 = none recorded (bound by path
 * alone; these 24 bytes were the tail of a 504-byte path, always zero, before). */
struct cuquota_limits_usage {
    uint32_t len; /* bytes of path in use, <= CUQUOTA_USAGE_PATH_MAX */
    uint32_t _reserved0;
    char path[CUQUOTA_USAGE_PATH_MAX]; /* absolute path, zero-padded, not NUL-terminated when full */
    uint64_t dev;      /* st_dev: makedev(stx_dev_major, stx_dev_minor) */
    uint64_t ino;      /* st_ino; 0 = no identity recorded */
    uint64_t btime_ns; /* stx_btime in ns since the epoch; 0 = the file system reports none */
};

struct cuquota_limits_file {
    struct cuquota_limits_header header;
    struct cuquota_limits_entry devices[CUQUOTA_MAX_DEVICES];
    struct cuquota_limits_members members; /* ABI 3 */
    struct cuquota_limits_usage usage;     /* ABI 3 */
};

struct cuquota_usage_header {
    uint64_t magic;           /* CUQUOTA_USAGE_MAGIC, stored last */
    uint32_t abi_version;     /* CUQUOTA_ABI_VERSION */
    uint32_t header_size;     /* sizeof(struct cuquota_usage_header) */
    uint64_t total_size;      /* sizeof(struct cuquota_usage_file) */
    uint32_t max_devices;     /* CUQUOTA_MAX_DEVICES */
    uint32_t max_procs;       /* CUQUOTA_MAX_PROCS */
    uint32_t proc_high_water;   /* one past the highest slot ever claimed */
    uint32_t shared_high_water; /* one past the highest shared entry ever claimed (ABI 4) */
    uint64_t last_use_ns;       /* elastic memory: last launch or copy of the container, CLOCK_BOOTTIME ns */
    uint64_t waiting;           /* elastic memory: (usage entry + 1) << 56 | bytes an allocation within the
                                   limit waits for (device full); 0 = none */
    uint64_t _reserved[1];
};

struct cuquota_usage_device {
    uint64_t uuid[2];                          /* valid once owner's state is LIVE */
    uint64_t owner;                            /* CUQUOTA_OWNER(claimer pid, state, gen) */
    struct cuquota_policy limits;              /* effective limits last reported (informational) */
    uint64_t throttle[CUQUOTA_THROTTLE_WORDS]; /* the shim's throttle state */
    uint64_t busy_ns;                          /* cumulative GPU busy time of the container, ns */
    uint64_t throttled_ns;                     /* cumulative time launches waited for the SM limit, ns */
    uint64_t refusals;                         /* allocations refused at the memory cap, cumulative */
};

struct cuquota_usage_slot {
    uint64_t owner;      /* CUQUOTA_OWNER(pid, state, gen) */
    uint64_t start_time; /* /proc/<pid>/stat field 22 */
    uint32_t host_pid;   /* pid as NVML reports it, 0 = unknown */
    uint32_t flags;      /* CUQUOTA_SLOT_LOCKED */
    uint64_t mem_used[CUQUOTA_MAX_DEVICES]; /* bytes, indexed by device entry */
    uint64_t gpu_ns[CUQUOTA_MAX_DEVICES];   /* GPU time, ns, indexed by device entry */
    uint64_t credit[CUQUOTA_CREDIT_DEVICES]; /* part of mem_used charged ahead of allocations (entries 0..4);
                                                anyone may take it back: swap to 0, then subtract from mem_used */
};

/* Memory held by several processes of the container (CUDA IPC, shareable VMM handles, pool exports), counted once (ABI 4). key: 0 free,
 * CUQUOTA_SHARED_CLAIMING being filled in, else the identity (stored last). Join: increment holders only while
 * non-zero, then set your slot's bit; leave: clear the bit, decrement; whoever takes holders to 0 frees it. */
struct cuquota_usage_shared {
    uint64_t key;
    uint64_t bytes;                                /* counted toward the container's usage on `device` */
    uint32_t device;                               /* usage device entry */
    uint32_t holders;                              /* bits set in holder_slots */
    uint64_t holder_slots[CUQUOTA_MAX_PROCS / 64]; /* bit i: slot i holds it */
    uint64_t _reserved[1];
};

struct cuquota_usage_file {
    struct cuquota_usage_header header;
    struct cuquota_usage_device devices[CUQUOTA_MAX_DEVICES];
    struct cuquota_usage_slot slots[CUQUOTA_MAX_PROCS];
    struct cuquota_usage_shared shared[CUQUOTA_MAX_SHARED]; /* ABI 4 */
};

#define CUQUOTA_PRIORITY_MAGIC 0x524f495250515543ULL /* "CUQPRIOR" as little-endian bytes */
#define CUQUOTA_PRIORITY_ABI_VERSION 5u
#define CUQUOTA_PRIORITY_INFLIGHT 8
#define CUQUOTA_INFLIGHT(mib, expires_s) ((uint64_t)(uint32_t)(mib) | ((uint64_t)(uint32_t)(expires_s) << 32))

struct cuquota_priority_header {
    uint64_t magic;          /* CUQUOTA_PRIORITY_MAGIC, stored last */
    uint32_t abi_version;    /* CUQUOTA_PRIORITY_ABI_VERSION */
    uint32_t header_size;    /* sizeof(struct cuquota_priority_header) */
    uint64_t total_size;     /* sizeof(struct cuquota_priority_file) */
    uint32_t max_devices;    /* CUQUOTA_MAX_DEVICES */
    uint32_t inflight_slots; /* CUQUOTA_PRIORITY_INFLIGHT */
    uint64_t _reserved[4];
};

struct cuquota_priority_device {
    uint64_t uuid[2];                             /* valid once owner's state is LIVE */
    uint64_t owner;                               /* CUQUOTA_OWNER(claimer pid, state, gen) */
    uint64_t hp_last_launch;                      /* latest high-priority launch, ns; 0 = never */
    uint64_t hp_busy_until;                       /* high-priority queued work estimated done at, ns */
    uint64_t hp_launches;                         /* cumulative */
    uint64_t be_token;                            /* best-effort queue token: 0 free, else held until, ns */
    uint64_t be_launches;                         /* best-effort launches under the token, cumulative */
    uint64_t be_waits;                            /* of them, launches that waited */
    uint64_t be_waited_ns;                        /* total wait, ns */
    uint64_t inflight[CUQUOTA_PRIORITY_INFLIGHT]; /* CUQUOTA_INFLIGHT(mib, expiry s) or 0 */
    uint64_t reserve_refusals;                    /* allocations refused to keep the reservation */
    uint64_t _reserved[5];
};

struct cuquota_priority_file {
    struct cuquota_priority_header header;
    struct cuquota_priority_device devices[CUQUOTA_MAX_DEVICES];
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct cuquota_policy) == 32, "policy size");
_Static_assert(sizeof(struct cuquota_limits_header) == 64, "limits header size");
_Static_assert(sizeof(struct cuquota_limits_entry) == 64, "limits entry size");
_Static_assert(sizeof(struct cuquota_limits_members) == 8 + 4 * CUQUOTA_MAX_MEMBERS, "limits members size");
_Static_assert(sizeof(struct cuquota_limits_usage) == 8 + CUQUOTA_USAGE_PATH_MAX + 24, "limits usage size");
_Static_assert(sizeof(struct cuquota_limits_file) == 64 + 64 * CUQUOTA_MAX_DEVICES + 8 + 4 * CUQUOTA_MAX_MEMBERS + 512,
               "limits file size");
_Static_assert(sizeof(struct cuquota_usage_header) == 64, "usage header size");
_Static_assert(sizeof(struct cuquota_usage_device) == 144, "usage device size");
_Static_assert(sizeof(struct cuquota_usage_slot) == 320, "usage slot size");
_Static_assert(sizeof(struct cuquota_usage_shared) == 160, "usage shared size");
_Static_assert(sizeof(struct cuquota_usage_file) ==
                   64 + 144 * CUQUOTA_MAX_DEVICES + 320 * CUQUOTA_MAX_PROCS + 160 * CUQUOTA_MAX_SHARED,
               "usage file size");
_Static_assert(sizeof(struct cuquota_priority_header) == 64, "priority header size");
_Static_assert(sizeof(struct cuquota_priority_device) == 192, "priority device size");
_Static_assert(sizeof(struct cuquota_priority_file) == 64 + 192 * CUQUOTA_MAX_DEVICES, "priority file size");
#endif

#endif /* CUQUOTA_H */
