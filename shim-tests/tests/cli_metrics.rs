//! `cuquota metrics`: a container's usage as Prometheus metrics, scraped over loopback (127.0.0.1 only).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use shim_tests::{cli_bin, Prog, Sim, MIB};

/// A free loopback port (bound and released: the metrics server binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from 127.0.0.1:`port`: (status line, body).
fn get(port: u16, path: &str) -> Option<(String, String)> {
    get_with(port, path, "")
}

/// GET `path` with the extra header lines `headers` (each ending in CRLF).
fn get_with(port: u16, path: &str, headers: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// The value of the series `name{labels}` in an exposition.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_scraped_over_loopback() {
    let sim = Sim::new().build();
    let mut holder = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .env("CUDA_DEVICE_SM_LIMIT", "40")
        .args("init alloc:mem:600m alloc:mem:600m uuid wait")
        .spawn();
    holder.wait_ready(1);
    let uuid = holder.wait_for("uuid");

    let port = free_port();
    let usage = sim.usage_file();
    let server = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("metrics --interval 200ms --namespace team-a --pod web-0 --container server --name web-0")
        .arg("--listen")
        .arg(&format!("127.0.0.1:{port}"))
        .arg("--usage")
        .arg(usage.to_str().unwrap())
        .spawn();

    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        match get(port, "/metrics") {
            Some((status, body)) if status.contains("200") => break body,
            _ if Instant::now() > deadline => panic!("no metrics served on 127.0.0.1:{port}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let labels = format!(
        r#"{{namespace="team-a",pod="web-0",container="server",vdevice_index="0",device_uuid="{uuid}",name="web-0"}}"#
    );
    let v = |name: &str| value(&body, &format!("{name}{labels}"));
    assert_eq!(
        v("hami_vgpu_memory_used_bytes"),
        Some((600 * MIB) as f64),
        "{body}"
    );
    assert_eq!(
        v("hami_vgpu_memory_limit_bytes"),
        Some((1024 * MIB) as f64),
        "{body}"
    );
    assert_eq!(v("cuquota_sm_limit_percent"), Some(40.0), "{body}");
    assert_eq!(v("cuquota_allocation_refusals_total"), Some(1.0), "{body}");
    assert_eq!(v("cuquota_processes"), Some(1.0), "{body}");
    assert_eq!(
        v("hami_container_device_utilization_ratio"),
        Some(0.0),
        "an idle holder:{body}"
    );
    assert!(v("cuquota_throttled_seconds_total").is_some(), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");

    let (status, _) = get(port, "/nope").unwrap();
    assert!(status.contains("404"), "{status}");

    let out = server.kill();
    assert!(
        out.stderr
            .contains(&format!("serving http://127.0.0.1:{port}/metrics")),
        "{out:?}"
    );
    holder.release();
    assert!(holder.finish().success());
}

#[test]
fn metrics_once_prints_one_sample() {
    let sim = Sim::new().build();
    let mut holder = sim
        .cmd(Prog::Probe)
        .mem_limit("2g")
        .args("init alloc:mem:100m wait")
        .spawn();
    holder.wait_ready(1);
    let usage = sim.usage_file();
    let out = sim.cli(&[
        "metrics",
        "--once",
        "--interval",
        "100ms",
        "--usage",
        usage.to_str().unwrap(),
    ]);
    assert!(out.success(), "{out:?}");
    let text = out.lines.join("\n");
    assert!(
        text.lines()
            .any(|l| l.starts_with("hami_vgpu_memory_used_bytes{") && l.ends_with(" 104857600.0")),
        "{text}"
    );
    assert!(
        text.contains(r#"name="usage.default""#),
        "the usage file's name labels it:{text}"
    );
    holder.release();
    assert!(holder.finish().success());
    // Neither --listen nor --once: an error.
    let out = sim.cli(&["metrics"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `cuquota metrics` serving `usage` on `listen` with `extra` arguments.
fn metrics_server(sim: &Sim, listen: &str, extra: &[&str]) -> shim_tests::Proc {
    let mut c = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(60))
        .args("metrics --interval 100ms --name web-0 --listen")
        .arg(listen)
        .arg("--usage")
        .arg(sim.usage_file().to_str().unwrap());
    for a in extra {
        c = c.arg(a);
    }
    c.spawn()
}

/// Waits until 127.0.0.1:`port` answers `path` (with `headers`) with anything.
fn first_answer(port: u16, path: &str, headers: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = get_with(port, path, headers) {
            return r;
        }
        assert!(Instant::now() < deadline, "nothing served on 127.0.0.1:{port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// #21 item 8: the metrics name every tenant and its usage. An address beyond loopback is refused without a
/// token (`:PORT` is loopback); with `--token-file`, /metrics answers only a scrape that sends the file's token
/// (`Authorization: Bearer`), while /healthz answers anyone (probes) and says nothing.
#[test]
fn metrics_beyond_loopback_need_a_bearer_token() {
    let sim = Sim::new().build();
    sim.cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:100m")
        .run();
    let port = free_port();
    let out = sim.cli(&[
        "metrics",
        "--listen",
        &format!("0.0.0.0:{port}"),
        "--usage",
        sim.usage_file().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("--token-file"), "{out:?}");

    let token = sim.dir().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let server = metrics_server(
        &sim,
        &format!("0.0.0.0:{port}"),
        &["--token-file", token.to_str().unwrap()],
    );
    let (status, body) = first_answer(port, "/healthz", "");
    assert!(status.contains("200") && body == "ok\n", "{status} {body}");
    for h in [
        "",
        "Authorization: Bearer s3cret\r\n",
        "Authorization: Basic s3cret-token\r\n",
    ] {
        let (status, body) = get_with(port, "/metrics", h).unwrap();
        assert!(status.contains("401"), "{h:?}: {status}");
        assert!(!body.contains("web-0"), "{h:?}: {body}");
    }
    let ok = "Authorization: Bearer s3cret-token\r\n";
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = get_with(port, "/metrics", ok).unwrap();
        if status.contains("200") {
            break body;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.contains(r#"name="web-0""#), "{body}");
    server.kill();
}

/// #21 item 8: a client that opens connections and sends nothing holds a bounded amount of the endpoint (4
/// connections of one address at once, each with a deadline), and scrapes work again once it lets go. The hand-rolled
/// server before spawned a thread per connection.
#[test]
fn the_metrics_endpoint_holds_a_bounded_number_of_connections() {
    let sim = Sim::new().build();
    sim.cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:100m")
        .run();
    let port = free_port();
    let server = metrics_server(&sim, &format!("127.0.0.1:{port}"), &[]);
    first_answer(port, "/metrics", "");
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{}/{what}", server.pid()))
            .unwrap()
            .count()
    };
    let (threads0, fds0) = (count("task"), count("fd"));
    let idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() >= 100, "{} connections", idle.len());
    std::thread::sleep(Duration::from_millis(500));
    let (threads, fds) = (count("task"), count("fd"));
    eprintln!("200 idle connections: threads {threads0} -> {threads}, descriptors {fds0} -> {fds}");
    assert!(threads <= threads0 + 2, "threads {threads0} -> {threads}");
    assert!(fds <= fds0 + 16 + 4, "descriptors {fds0} -> {fds}");
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if get(port, "/metrics").is_some_and(|(s, _)| s.contains("200")) {
            break;
        }
        assert!(Instant::now() < deadline, "no scrape after the idle clients left");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
}

/// A TCP connection to 127.0.0.1:`port` from the loopback address `from` (another peer than the test's
/// 127.0.0.1).
fn connect_from(from: [u8; 4], port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket/bind/connect with a sockaddr_in of the given length; the descriptor is handed to
    // TcpStream, which owns it from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let src = addr(from, 0);
        let r = libc::bind(fd, &src as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "bind {from:?}: {}", std::io::Error::last_os_error());
        let dst = addr([127, 0, 0, 1], port);
        let r = libc::connect(fd, &dst as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// #21 item 8: a peer that holds idle connections takes at most 4 (`MAX_PER_PEER`) of the endpoint, so an
/// authenticated scraper from another address gets every scrape through while it holds 16 (with one bound of
/// 16 connections for everyone, 16 idle connections refused every scrape).
#[test]
fn idle_connections_of_one_peer_do_not_deny_a_scraper() {
    let sim = Sim::new().build();
    sim.cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:100m")
        .run();
    let port = free_port();
    let token = sim.dir().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let server = metrics_server(
        &sim,
        &format!("0.0.0.0:{port}"),
        &["--token-file", token.to_str().unwrap()],
    );
    let ok = "Authorization: Bearer s3cret-token\r\n";
    first_answer(port, "/metrics", ok);
    let idle: Vec<TcpStream> = (0..16).map(|_| connect_from([127, 0, 0, 2], port)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut refused = 0;
    for _ in 0..20 {
        if !get_with(port, "/metrics", ok).is_some_and(|(s, b)| s.contains("200") && b.contains("web-0")) {
            refused += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(idle);
    server.kill();
    assert_eq!(
        refused, 0,
        "16 idle connections of another peer denied {refused} of 20 scrapes"
    );
}

/// A TCP connection to 127.0.0.1:`port` from the loopback address `from`, or None when it is not made
/// within `timeout` (the server's queue full) or refused.
fn try_connect_from(from: [u8; 4], port: u16, timeout: Duration) -> Option<TcpStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: socket/setsockopt/bind/connect with a timeval and sockaddr_in of the sizes given; the descriptor
    // is owned by an OwnedFd (closed on every failure) and then by the TcpStream. Linux bounds a blocking
    // connect by SO_SNDTIMEO.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return None;
        }
        let owned = OwnedFd::from_raw_fd(fd);
        let tvp = &tv as *const libc::timeval as *const libc::c_void;
        let tvlen = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, tvp, tvlen) != 0 {
            return None;
        }
        let src = addr(from, 0);
        if libc::bind(fd, &src as *const _ as *const libc::sockaddr, len) != 0 {
            return None;
        }
        let dst = addr([127, 0, 0, 1], port);
        if libc::connect(fd, &dst as *const _ as *const libc::sockaddr, len) != 0 {
            return None;
        }
        Some(TcpStream::from(owned))
    }
}

/// Slow clients: `per_addr` connections from each of the loopback addresses 127.0.0.`addrs`, each sending the
/// start of a request head and then a byte every 100 ms, never its end; one the server closes is opened again
/// at the next round (every 100 ms). Runs until `stop` (at most 60 s); returns the connections it made.
fn slowloris(
    port: u16,
    addrs: std::ops::RangeInclusive<u8>,
    per_addr: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let from: Vec<[u8; 4]> = addrs.flat_map(|a| vec![[127, 0, 0, a]; per_addr]).collect();
        let mut conns: Vec<Option<TcpStream>> = (0..from.len()).map(|_| None).collect();
        let mut made = 0u64;
        let end = Instant::now() + Duration::from_secs(60);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
            for (c, &a) in conns.iter_mut().zip(&from) {
                let alive = c.as_mut().is_some_and(|s| {
                    let mut b = [0u8; 64];
                    match s.read(&mut b) {
                        Ok(_) => false, // closed (0) or answered: the server let go of it
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => s.write_all(b"a").is_ok(),
                        Err(_) => false,
                    }
                });
                if !alive {
                    *c = try_connect_from(a, port, Duration::from_millis(200)).and_then(|mut s| {
                        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nX-").ok()?;
                        s.set_nonblocking(true).ok()?;
                        made += 1;
                        Some(s)
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        made
    })
}

/// `n` scrapes of /metrics with `auth`, one after the other, each given 3 s: how many answered 200 with the
/// container's series, and the longest one took.
fn scrapes(port: u16, auth: &str, n: usize) -> (usize, Duration) {
    let (mut ok, mut longest) = (0, Duration::ZERO);
    for _ in 0..n {
        let t = Instant::now();
        let answered = (|| {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
            write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n").ok()?;
            let mut resp = String::new();
            s.read_to_string(&mut resp).ok()?;
            Some(resp.starts_with("HTTP/1.1 200") && resp.contains(r#"name="web-0""#))
        })();
        longest = longest.max(t.elapsed());
        ok += usize::from(answered == Some(true));
        std::thread::sleep(Duration::from_millis(100));
    }
    (ok, longest)
}

/// 16 authenticated scrapes of the endpoint (token file, 127.0.0.1), under slow connections from
/// 127.0.0.2–127.0.0.101 (3 each, reopened when closed) or none: (scrapes answered, the longest, descriptors
/// the server held during the scrapes more than before the attack, connections the attacker made).
fn scrapes_under_slowloris(attack: bool) -> (usize, Duration, usize, u64) {
    let sim = Sim::new().build();
    sim.cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init alloc:mem:100m")
        .run();
    let port = free_port();
    let token = sim.dir().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let server = metrics_server(
        &sim,
        &format!("127.0.0.1:{port}"),
        &["--token-file", token.to_str().unwrap()],
    );
    let ok = "Authorization: Bearer s3cret-token\r\n";
    let deadline = Instant::now() + Duration::from_secs(20);
    while !get_with(port, "/metrics", ok).is_some_and(|(s, _)| s.contains("200")) {
        assert!(Instant::now() < deadline, "no metrics served on 127.0.0.1:{port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
            .unwrap()
            .count()
    };
    let fds0 = fds();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = attack.then(|| slowloris(port, 2..=101, 3, stop.clone()));
    if attack {
        // Until the slow connections hold the server's share for them (at least 100 connections).
        let deadline = Instant::now() + Duration::from_secs(20);
        while fds() < fds0 + 100 {
            assert!(
                Instant::now() < deadline,
                "the slow clients hold {} connections",
                fds() - fds0
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let held = fds().saturating_sub(fds0);
    let (answered, longest) = scrapes(port, ok, 16);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let made = attacker.map_or(0, |a| a.join().unwrap());
    server.kill();
    eprintln!(
        "attack {attack}: {answered} of 16 scrapes answered, longest {longest:?}; the server held {held} more \
         descriptors, the attacker made {made} connections"
    );
    (answered, longest, held, made)
}

/// Issue 35 item 5: slow connections that never finish their request head, 3 from each of 100 loopback
/// addresses, do not keep authenticated scrapes out: a connection counts against authenticated clients'
/// slots only once its head carried the token, a new connection displaces the oldest unauthenticated one,
/// and an unauthenticated connection is closed 1 s after it came. Main's code counted every connection from
/// its accept (4 per address, 128 in all) and answered 0 of 16 scrapes here. Control:
/// `authenticated_scrapes_succeed_without_slow_clients`.
#[test]
fn slow_connections_from_many_addresses_do_not_starve_authenticated_scrapes() {
    let (answered, _, held, made) = scrapes_under_slowloris(true);
    assert!(
        held >= 100 && made >= 300,
        "the attack held {held} connections, made {made}"
    );
    assert_eq!(
        answered, 16,
        "slow clients on 100 addresses starved authenticated scrapes: {answered} of 16 answered"
    );
}

/// Control of the test above: the same scrapes, no slow clients.
#[test]
fn authenticated_scrapes_succeed_without_slow_clients() {
    let (answered, ..) = scrapes_under_slowloris(false);
    assert_eq!(answered, 16, "{answered} of 16 scrapes answered");
}
