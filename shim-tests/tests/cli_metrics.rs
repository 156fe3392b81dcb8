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
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
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
