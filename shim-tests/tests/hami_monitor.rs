//! HAMi's vGPU monitor's view of a cuquota container (docs/hami.md). This test plays the monitor: it maps the
//! file at `CUDA_DEVICE_MEMORY_SHARED_CACHE` read-write at the monitor's size, as HAMi's
//! `pkg/monitor/nvidia/cudevshr.go` does, and reads it with offsets written here from HAMi-core's
//! `shared_region_t` (not cuquota's struct, so a wrong offset there is caught), while tenants run on the
//! simulator. Then it writes what the monitor's `Observe` writes every 5 s (`recent_kernel`,
//! `utilization_switch`) and checks that launches block and resume.

use shim_tests::{mono_ns, Prog, Sim};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

// HAMi-core 1.2, `src/multiprocess/multiprocess_memory_limit.h`, 64-bit Linux (sem_t 32 bytes, size_t 8).
const SIZE: usize = 2_008_952; // sizeof(shared_region_t) = HAMi's v1.MinSize()
const MAGIC: i32 = 19_920_718;
const MAJOR: usize = 4;
const DEVICE_NUM: usize = 56;
const UUIDS: usize = 64; // char[16][96]
const LIMIT: usize = 1600;
const SM_LIMIT: usize = 1728;
const PROCS: usize = 1856;
const SLOT: usize = 1960; // sizeof(shrreg_proc_slot_t)
const SLOT_HOSTPID: usize = 4;
const SLOT_USED: usize = 8; // device_memory_t[16], 64 bytes each: context, module, data, offset, total
const SLOT_UTIL: usize = 1160; // device_util_t[16], 48 bytes each: dec, enc, sm
const SLOT_STATUS: usize = 1928;
const PROC_NUM: usize = 2_008_896;
const UTIL_SWITCH: usize = 2_008_900;
const RECENT_KERNEL: usize = 2_008_904;
const PRIORITY: usize = 2_008_908;
const LAST_KERNEL_TIME: usize = 2_008_912;

/// The monitor's mapping: the whole file, read-write, shared (it refuses a file shorter than v1's size).
struct Monitor {
    ptr: *mut u8,
}

impl Monitor {
    fn open(path: &std::path::Path) -> Monitor {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let len = f.metadata().unwrap().len();
        assert!(
            len >= SIZE as u64,
            "{}: {len} bytes, HAMi's monitor needs at least {SIZE} for layout v1",
            path.display()
        );
        // SAFETY: a fresh shared mapping of SIZE bytes of a file at least that long.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let m = Monitor { ptr: ptr.cast() };
        assert_eq!(m.i32(0), MAGIC, "the monitor's magic check (initialized_flag)");
        assert_eq!(m.i32(MAJOR), 1, "the monitor's v1 reader needs major version 1");
        m
    }
    fn i32(&self, off: usize) -> i32 {
        assert!(off + 4 <= SIZE);
        // SAFETY: in bounds, aligned (every offset used is a multiple of 4), mapped; volatile: others write it.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<i32>()) }
    }
    fn u64(&self, off: usize) -> u64 {
        assert!(off + 8 <= SIZE);
        // SAFETY: as above (multiples of 8).
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u64>()) }
    }
    fn set_i32(&self, off: usize, v: i32) {
        assert!(off + 4 <= SIZE);
        // SAFETY: as above; the monitor writes these words the same way (atomic 32-bit stores).
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<i32>(), v) }
    }
    fn uuid(&self, dev: usize) -> String {
        let b: Vec<u8> = (0..96)
            .map(|i| {
                // SAFETY: in bounds of the mapping.
                unsafe { std::ptr::read_volatile(self.ptr.add(UUIDS + 96 * dev + i)) }
            })
            .take_while(|&c| c != 0)
            .collect();
        String::from_utf8_lossy(&b).into_owned()
    }
    /// Slots the monitor sums: `procs[:proc_num]` with a non-zero status.
    fn live_slots(&self) -> Vec<usize> {
        let n = self.i32(PROC_NUM).clamp(0, 1024) as usize;
        (0..n)
            .map(|i| PROCS + SLOT * i)
            .filter(|&s| self.i32(s + SLOT_STATUS) != 0)
            .collect()
    }
    fn slot_of(&self, pid: u32) -> Option<usize> {
        self.live_slots().into_iter().find(|&s| self.i32(s) == pid as i32)
    }
    /// `(context, module, data, total)` of slot `s` on device `dev`.
    fn used(&self, s: usize, dev: usize) -> (u64, u64, u64, u64) {
        let u = s + SLOT_USED + 64 * dev;
        (self.u64(u), self.u64(u + 8), self.u64(u + 16), self.u64(u + 32))
    }
    /// `DeviceMemoryTotal(dev)` as the monitor's v1 reader computes it.
    fn total(&self, dev: usize) -> u64 {
        self.live_slots().iter().map(|&s| self.used(s, dev).3).sum()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // SAFETY: our own mapping of SIZE bytes.
        unsafe { libc::munmap(self.ptr.cast(), SIZE) };
    }
}

fn hami_file(sim: &Sim) -> std::path::PathBuf {
    // The harness's default: CUDA_DEVICE_MEMORY_SHARED_CACHE beside the container's usage file.
    std::path::PathBuf::from(format!("{}.hami.cache", sim.usage_file().display()))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn hamis_monitor_reads_the_true_limits_and_usage() {
    let sim = Sim::new().ctx_overhead("96m").build();
    let mut t = sim
        .cmd(Prog::Probe)
        .mem_limit("4g")
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUDA_TASK_PRIORITY", "0")
        .args("init uuid pid alloc:mem:1g alloc:mem:256m info simused wait")
        .timeout(Duration::from_secs(60))
        .spawn();
    t.wait_ready(1);
    let pid: u32 = t.wait_for("pid").parse().unwrap();
    let uuid = t.wait_for("uuid");
    let free: u64 = t.wait_for("info.free").parse().unwrap();
    let total: u64 = t.wait_for("info.total").parse().unwrap();
    let sim_used: u64 = t.wait_for("sim.used.0").parse().unwrap();

    let m = Monitor::open(&hami_file(&sim));
    assert_eq!(m.u64(DEVICE_NUM), 1, "device count");
    assert_eq!(m.uuid(0), uuid, "the device's UUID, as NVML prints it");
    assert_eq!(m.u64(LIMIT), 4 * GIB, "memory limit of device 0");
    assert_eq!(m.u64(SM_LIMIT), 30, "SM limit of device 0");
    assert_eq!(m.i32(PRIORITY), 0, "CUDA_TASK_PRIORITY");
    let s = m
        .slot_of(pid)
        .unwrap_or_else(|| panic!("no live slot for pid {pid}"));
    assert_eq!(
        m.i32(s + SLOT_HOSTPID),
        pid as i32,
        "host pid (one pid namespace here)"
    );
    let (ctx, module, data, sum) = m.used(s, 0);
    assert_eq!(data, GIB + 256 * (1 << 20), "data: the two allocations");
    assert_eq!(sum, ctx + module + data, "total = context + module + data");
    // What the tenant itself sees under its cap, and what the simulated device holds for it.
    assert_eq!(
        m.total(0),
        total - free,
        "the container's usage as cuMemGetInfo shows it"
    );
    assert_eq!(
        sim_used, sum,
        "the simulator's own count of the tenant's device memory"
    );
    assert!(ctx > 0, "context overhead is shown");

    t.release();
    assert!(t.finish().success());
    assert!(m.slot_of(pid).is_none(), "an exited process's slot is given back");
    assert_eq!(
        m.total(0),
        0,
        "nothing is shown for a container with no process left"
    );
}

#[test]
fn hamis_monitor_blocks_and_resumes_launches() {
    let sim = Sim::new().build();
    let be = sim
        .cmd(Prog::PriorityTenant)
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .args("be 10 1000000 2000000 11")
        .timeout(Duration::from_secs(60))
        .spawn();
    let pid = be.pid();
    let path = hami_file(&sim);
    // The monitor skips a file until it is whole and initialised (its magic is written last).
    wait_until("the HAMi file", Duration::from_secs(20), || {
        use std::io::Read;
        let mut head = [0u8; 4];
        std::fs::metadata(&path).is_ok_and(|m| m.len() >= SIZE as u64)
            && std::fs::File::open(&path).is_ok_and(|mut f| f.read_exact(&mut head).is_ok())
            && i32::from_le_bytes(head) == MAGIC
    });
    let m = Monitor::open(&path);
    wait_until("the tenant's slot", Duration::from_secs(20), || {
        m.slot_of(pid).is_some()
    });
    let s = m.slot_of(pid).unwrap();
    // The monitor decrements recent_kernel every 5 s; a launching tenant sets it back to 2 (HAMi-core).
    m.set_i32(RECENT_KERNEL, 1);
    wait_until("recent_kernel = 2", Duration::from_secs(5), || {
        m.i32(RECENT_KERNEL) == 2
    });
    let lk = m.u64(LAST_KERNEL_TIME);
    assert!(lk.abs_diff(unix_s()) <= 5, "last_kernel_time {lk} is now");

    // A higher-priority task runs: the monitor blocks this one.
    m.set_i32(UTIL_SWITCH, 1);
    m.set_i32(RECENT_KERNEL, -1);
    let blocked = mono_ns();
    std::thread::sleep(Duration::from_millis(1300));
    // The switch off (no contention): HAMi-core does not gate then, so neither does cuquota.
    m.set_i32(UTIL_SWITCH, 0);
    let switched_off = mono_ns();
    std::thread::sleep(Duration::from_millis(1300));
    // Blocked again, then released.
    m.set_i32(UTIL_SWITCH, 1);
    std::thread::sleep(Duration::from_millis(600));
    m.set_i32(RECENT_KERNEL, 0);
    let resumed = mono_ns();
    std::thread::sleep(Duration::from_millis(1300));
    // The slot's SM utilisation: sampled once a second from the GPU time the throttle measures.
    let mut util = 0;
    wait_until("sm_util", Duration::from_secs(3), || {
        util = m.u64(s + SLOT_UTIL + 16);
        util >= 10
    });
    let o = be.finish();
    assert!(o.success(), "{o:?}");

    let ms = 1_000_000;
    let share = |from: u64| sim.busy_ns(0, pid, from + 300 * ms, from + 1300 * ms) as f64 / 1e9;
    let (b, off, r) = (share(blocked), share(switched_off), share(resumed));
    assert!(
        b < 0.05,
        "launches go on while HAMi's monitor blocks them: {b:.3} of the device"
    );
    assert!(
        off > 0.2,
        "with utilization_switch off launches are not gated: {off:.3}"
    );
    assert!(r > 0.2, "launches resume once the monitor unblocks: {r:.3}");
    // A one-second sample of a tenant that runs (the default policy lets it use idle time beyond its 50 %):
    // at least the 10 % waited for above, never more than the whole device.
    assert!(util <= 100, "sm_util {util} %");
}

/// The file is the container's to write: truncated (or zeroed) under a running tenant, it crashes no one and
/// changes no limit (the mapping turns into private zero pages, as for the usage file).
#[test]
fn a_truncated_hami_file_crashes_no_one_and_changes_no_limit() {
    let sim = Sim::new().build();
    let mut t = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:512m wait alloc:mem:256m alloc:mem:512m info")
        .timeout(Duration::from_secs(60))
        .spawn();
    t.wait_ready(1);
    let path = hami_file(&sim);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE as u64);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    t.release();
    let o = t.finish();
    assert!(o.success(), "the tenant survives its HAMi file truncated: {o:?}");
    o.expect("alloc.1", "CUDA_SUCCESS");
    // 512 + 256 MiB held: another 512 MiB is still over the 1 GiB cap.
    o.expect("alloc.2", "CUDA_ERROR_OUT_OF_MEMORY");
}

/// A forked child is another process to the monitor: it claims a slot of its own, leaving its parent's slot and
/// figures as they were; the probe's children `_exit`, so their slots go back when the parent next asks for
/// memory information (the reaping of slots of processes that are gone).
#[test]
fn forked_children_take_their_own_slots_and_leave_the_parents() {
    let sim = Sim::new().build();
    let mut t = sim
        .cmd(Prog::Probe)
        .mem_limit("4g")
        .args("init pid alloc:mem:64m forks:1:4:1m sleep:150 info wait")
        .timeout(Duration::from_secs(60))
        .spawn();
    t.wait_ready(1);
    let pid: u32 = t.wait_for("pid").parse().unwrap();
    assert_eq!(t.wait_for("forks.ok"), "4");
    let m = Monitor::open(&hami_file(&sim));
    assert!(m.i32(PROC_NUM) >= 2, "the children claimed slots of their own");
    let s = m
        .slot_of(pid)
        .expect("the parent's slot survives its children's exits");
    assert_eq!(m.live_slots(), vec![s], "the children's slots went back");
    assert_eq!(m.used(s, 0).2, 64 << 20, "the parent's data figure");
    t.release();
    assert!(t.finish().success());
}

/// HAMi's device plugin's `Allocate` for one container (HAMi `pkg/device-plugin/nvidiadevice/nvinternal/
/// plugin/server.go`, HOOK_PATH=/usr/local), with `libvgpu.so` on the host replaced by `libcuquota.so`: the
/// library at `/usr/local/vgpu/libvgpu.so` (read-only) and named in a read-only `/etc/ld.so.preload`, the
/// pod's cache directory `vgpu/containers/<pod uid>_<container>` read-write at `/usr/local/vgpu`,
/// `/tmp/vgpulock`, and the env it sets (`CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m`, `CUDA_DEVICE_SM_LIMIT`,
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<uuid>.cache`). Applied by podman to a real container on
/// the simulated GPU: the cap holds inside, and on the host the pod's cache directory holds exactly one
/// `*.cache`, which HAMi's monitor maps and reads the container's limits from. The control (the same container
/// without the preload mount, i.e. without the library) gets the whole GPU.
#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn hamis_device_plugin_mounts_and_env_run_cuquota_in_a_real_container() {
    use shim_tests::containers::{out_val, sim_env, sim_mounts, Mount, Runtime};
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    const GPU: &str = "GPU-0badc0de-1111-2222-3333-444455556666";
    let sim = Sim::new().memory("16g").uuids(GPU).build();
    let state = sim.dir().join("sim.state");
    std::fs::write(&state, b"").unwrap();
    // The host's HOOK_PATH/vgpu, as HAMi's device plugin lays it out, with cuquota in libvgpu.so's place.
    let vgpu = sim.dir().join("hook/vgpu");
    let cache_dir = vgpu.join("containers/3f1e0c8a-5b7d-4e2f-9a61-0c2d4e6f8a10_notebook");
    std::fs::create_dir_all(&cache_dir).unwrap();
    std::fs::copy(shim_tests::shim_lib(), vgpu.join("libvgpu.so")).unwrap();
    std::fs::write(vgpu.join("ld.so.preload"), "/usr/local/vgpu/libvgpu.so\n").unwrap();
    let lock = sim.dir().join("vgpulock");
    std::fs::create_dir_all(&lock).unwrap();
    for d in [&cache_dir, &lock] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let probe = shim_tests::program(Prog::AllocProbe);
    let rt = Runtime::new(sim.dir(), &[&probe]);
    let mut mounts = vec![
        Mount {
            host: vgpu.join("libvgpu.so"),
            container: "/usr/local/vgpu/libvgpu.so".into(),
            writable: false,
        },
        Mount {
            host: cache_dir.clone(),
            container: "/usr/local/vgpu".into(),
            writable: true,
        },
        Mount {
            host: lock,
            container: "/tmp/vgpulock".into(),
            writable: true,
        },
    ];
    mounts.extend(sim_mounts(&state));
    let preload = Mount {
        host: vgpu.join("ld.so.preload"),
        container: "/etc/ld.so.preload".into(),
        writable: false,
    };
    let mut env = sim_env("16g", GPU);
    env.extend([
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m".to_string(),
        "CUDA_DEVICE_SM_LIMIT=30".into(),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/9d5b1c2e-7f3a-4b8c-a1d2-e3f4a5b6c7d8.cache".into(),
    ]);
    let args = |with_preload: bool| -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        for m in mounts.iter().chain(with_preload.then_some(&preload)) {
            a.extend(m.args());
        }
        for e in &env {
            a.extend(["-e".into(), e.clone()]);
        }
        a
    };

    let (ok, out) = rt.run(&args(true), &["/alloc_probe", "256m"]);
    assert!(ok, "podman run with HAMi's mounts and env failed:\n{out}");
    assert_eq!(out_val(&out, "meminfo_total_mib"), 4096, "{out}");
    let got = out_val(&out, "allocated_mib");
    assert!(
        (3584..=4096).contains(&got),
        "allocated {got} MiB under HAMi's 4096m:\n{out}"
    );

    // What HAMi's monitor finds on the host: one *.cache in the pod's directory, in HAMi-core's layout.
    let caches: Vec<_> = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cache"))
        .collect();
    assert_eq!(
        caches.len(),
        1,
        "the monitor needs exactly one *.cache: {caches:?}"
    );
    let m = Monitor::open(&caches[0]);
    assert_eq!(m.u64(DEVICE_NUM), 1, "device count");
    assert_eq!(m.uuid(0), GPU, "the device's UUID");
    assert_eq!(m.u64(LIMIT), 4 * GIB, "memory limit of device 0");
    assert_eq!(m.u64(SM_LIMIT), 30, "SM limit of device 0");
    assert!(
        m.live_slots().is_empty(),
        "the container's process exited: no live slot"
    );

    // The control: no /etc/ld.so.preload, so no library: the whole GPU.
    let (ok, out) = rt.run(&args(false), &["/alloc_probe", "256m"]);
    assert!(ok, "the control run failed:\n{out}");
    assert_eq!(out_val(&out, "meminfo_total_mib"), 16384, "{out}");
}
