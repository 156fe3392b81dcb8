//! Prometheus metrics: the series (HAMi's names, so existing dashboards work, and cuquota's own), rendered with
//! `prometheus-client` from the same report structs `status` and the agent print, and a small HTTP endpoint.
//! `cuquota metrics` (the CLI's `metrics.rs`) serves one container's usage file with them.
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `hami_vgpu_memory_used_bytes` | gauge | device memory the container uses |
//! | `hami_vgpu_memory_limit_bytes` | gauge | its cap (absent when none) |
//! | `hami_container_device_utilization_ratio` | gauge | its share of the device over the last interval, percent 0–100 (HAMi's unit) |
//! | `hami_container_last_kernel_elapsed_seconds` | gauge | seconds since it last used the device (absent until it has) |
//! | `cuquota_sm_limit_percent` | gauge | its SM limit (absent when none) |
//! | `cuquota_achieved_share_ratio` | gauge | the share as a ratio 0–1 |
//! | `cuquota_gpu_seconds_total` | counter | GPU time it used (rate = achieved share) |
//! | `cuquota_throttled_seconds_total` | counter | time its launches waited for the SM limit |
//! | `cuquota_processes` | gauge | its processes on the device |
//! | `cuquota_allocation_refusals_total` | counter | allocations refused at its cap |
//! | `cuquota_memory_request_bytes` | gauge | its guaranteed memory: the request, else the cap (absent when uncapped) |
//! | `cuquota_memory_resident_bytes` | gauge | its memory on the device (the agent: NVML) |
//! | `cuquota_memory_evicted_bytes` | gauge | its memory moved to host memory (the agent: charged less resident) |
//! | `cuquota_memory_waiting_bytes` | gauge | bytes an allocation of it waits for, the device being full |
//! | `cuquota_memory_restoring_bytes` | gauge | 0: not measured yet |
//! | `cuquota_wakeup_latency_seconds` | histogram | restores before a launch: empty until eviction exists |
//! | `cuquota_agent_actions_total` | counter | agent actions on it, by `action` (agent only) |
//!
//! Labels: `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid` (HAMi's; blank where unknown) and
//! `name`, the container's id for cuquota (descriptor name), which keeps series of containers without
//! Kubernetes labels apart.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use cuquota_core::log::Level;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::AgentError;

/// The labels of a container's per-device series.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// The device's index in the container's view (usage-file entry), blank when unknown.
    pub vdevice_index: String,
    /// `GPU-…`.
    pub device_uuid: String,
    /// cuquota's id of the container.
    pub name: String,
}

/// Labels of an agent action counter.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// cuquota's id of the container.
    pub name: String,
    /// The action kind.
    pub action: String,
}

/// One container on one device, as the metrics see it.
#[derive(Clone, Debug, Default)]
pub struct DeviceSample {
    /// Its labels.
    pub labels: DeviceLabels,
    /// Device memory used, bytes.
    pub memory_used_bytes: u64,
    /// Cap, bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Guaranteed memory, bytes (the request, else the cap).
    pub memory_request_bytes: Option<u64>,
    /// Device memory resident, bytes (the agent: NVML).
    pub memory_resident_bytes: u64,
    /// Memory moved to host memory, bytes (the agent: the usage file's charge less NVML's resident, at most
    /// the part of the limit above the request).
    pub memory_evicted_bytes: u64,
    /// Bytes an allocation waits for, the device being full (the container's `waiting` word).
    pub memory_waiting_bytes: u64,
    /// SM limit, percent.
    pub sm_limit_percent: Option<u32>,
    /// Share of the device over the last interval, percent.
    pub utilization_percent: Option<f64>,
    /// Seconds since the container last used the device.
    pub last_kernel_age_seconds: Option<f64>,
    /// GPU time used, cumulative seconds.
    pub gpu_seconds_total: Option<f64>,
    /// Time launches waited for the SM limit, cumulative seconds.
    pub throttled_seconds_total: Option<f64>,
    /// Allocations refused at the cap, cumulative.
    pub allocation_refusals_total: Option<u64>,
    /// Processes on the device.
    pub processes: u64,
}

/// Everything one scrape shows.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per container and device.
    pub devices: Vec<DeviceSample>,
    /// Agent action counters (every kind, 0 until something happened); empty outside the agent.
    pub actions: Vec<(ActionLabels, u64)>,
    /// Agent passes so far (None outside the agent).
    pub agent_passes: Option<u64>,
}

type GaugeF = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Buckets of `cuquota_wakeup_latency_seconds`: 1 ms to about 4 s.
fn wakeup_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 13))
}
type CounterF = Counter<f64, std::sync::atomic::AtomicU64>;

/// The OpenMetrics text of `snap`.
pub fn render(snap: &Snapshot) -> String {
    let mut reg = Registry::default();
    let gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<DeviceLabels, GaugeF>::default();
        reg.register(name, help, f.clone());
        f
    };
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<DeviceLabels, CounterF>::default();
        reg.register(name, help, f.clone());
        f
    };
    let used = gauge(
        &mut reg,
        "hami_vgpu_memory_used_bytes",
        "Device memory used by the container, bytes",
    );
    let limit = gauge(
        &mut reg,
        "hami_vgpu_memory_limit_bytes",
        "Device memory cap of the container, bytes",
    );
    let util = gauge(
        &mut reg,
        "hami_container_device_utilization_ratio",
        "Share of the device the container used over the last interval, percent (0-100)",
    );
    let last = gauge(
        &mut reg,
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container last ran a kernel on the device",
    );
    let sm = gauge(
        &mut reg,
        "cuquota_sm_limit_percent",
        "SM-time limit of the container, percent",
    );
    let share = gauge(
        &mut reg,
        "cuquota_achieved_share_ratio",
        "Share of the device the container used over the last interval (0-1)",
    );
    let gpu = counter(
        &mut reg,
        "cuquota_gpu_seconds",
        "GPU time the container used, seconds",
    );
    let thr = counter(
        &mut reg,
        "cuquota_throttled_seconds",
        "Time the container's launches waited for its SM limit, seconds",
    );
    let procs = gauge(
        &mut reg,
        "cuquota_processes",
        "Processes of the container on the device",
    );
    let refused = counter(
        &mut reg,
        "cuquota_allocation_refusals",
        "Allocations refused at the container's memory cap",
    );
    let request = gauge(
        &mut reg,
        "cuquota_memory_request_bytes",
        "Device memory guaranteed to the container (its request, else its cap), bytes",
    );
    let resident = gauge(
        &mut reg,
        "cuquota_memory_resident_bytes",
        "Device memory of the container resident on the device, bytes (the agent: NVML)",
    );
    let evicted = gauge(
        &mut reg,
        "cuquota_memory_evicted_bytes",
        "Memory of the container moved to host memory, bytes (the agent: charged less resident)",
    );
    let waiting = gauge(
        &mut reg,
        "cuquota_memory_waiting_bytes",
        "Bytes an allocation of the container waits for, the device being full",
    );
    let restoring = gauge(
        &mut reg,
        "cuquota_memory_restoring_bytes",
        "Memory of the container being moved back to the device, bytes (always 0: eviction does not exist yet)",
    );
    let wakeup =
        Family::<DeviceLabels, Histogram>::new_with_constructor(wakeup_histogram as fn() -> Histogram);
    reg.register(
        "cuquota_wakeup_latency_seconds",
        "Time a launch waited for the container's evicted memory to come back, seconds (no observations: \
         eviction does not exist yet)",
        wakeup.clone(),
    );
    for d in &snap.devices {
        let l = &d.labels;
        used.get_or_create(l).set(d.memory_used_bytes as f64);
        if let Some(v) = d.memory_limit_bytes {
            limit.get_or_create(l).set(v as f64);
        }
        if let Some(v) = d.utilization_percent {
            util.get_or_create(l).set(v);
            share.get_or_create(l).set(v / 100.0);
        }
        if let Some(v) = d.last_kernel_age_seconds {
            last.get_or_create(l).set(v);
        }
        if let Some(v) = d.sm_limit_percent {
            sm.get_or_create(l).set(f64::from(v));
        }
        if let Some(v) = d.gpu_seconds_total {
            gpu.get_or_create(l).inc_by(v);
        }
        if let Some(v) = d.throttled_seconds_total {
            thr.get_or_create(l).inc_by(v);
        }
        if let Some(v) = d.allocation_refusals_total {
            refused.get_or_create(l).inc_by(v as f64);
        }
        procs.get_or_create(l).set(d.processes as f64);
        if let Some(v) = d.memory_request_bytes {
            request.get_or_create(l).set(v as f64);
        }
        resident.get_or_create(l).set(d.memory_resident_bytes as f64);
        evicted.get_or_create(l).set(d.memory_evicted_bytes as f64);
        waiting.get_or_create(l).set(d.memory_waiting_bytes as f64);
        restoring.get_or_create(l).set(0.0);
        let _ = wakeup.get_or_create(l); // the series, with no observations
    }
    if snap.agent_passes.is_some() || !snap.actions.is_empty() {
        let actions = Family::<ActionLabels, Counter>::default();
        reg.register(
            "cuquota_agent_actions",
            "Actions the agent took on the container's processes, by kind",
            actions.clone(),
        );
        for (l, n) in &snap.actions {
            actions.get_or_create(l).inc_by(*n);
        }
        let passes = Counter::<u64>::default();
        reg.register(
            "cuquota_agent_passes",
            "Sampling passes the agent completed",
            passes.clone(),
        );
        passes.inc_by(snap.agent_passes.unwrap_or(0));
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

/// The latest rendering, shared with the HTTP threads.
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<Mutex<Option<String>>>);

impl Published {
    /// Replaces what scrapes see.
    pub fn set(&self, text: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A `--listen` address that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    /// Not an address, or a name that does not resolve.
    #[error("{0}; expected HOST:PORT such as 127.0.0.1:9400 or :9400")]
    Invalid(String),
    /// A name that resolves to nothing.
    #[error("resolves to no address")]
    NoAddress,
}

/// The bearer token file of the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It cannot be read.
    #[error("token file {}: {source}", .file.display())]
    Unreadable {
        /// `--token-file`.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It holds only whitespace.
    #[error("token file {} is empty", .0.display())]
    Empty(PathBuf),
}

/// `HOST:PORT`, `[::1]:PORT`, or `:PORT` (127.0.0.1: loopback unless an address is named).
pub fn parse_listen(s: &str) -> Result<SocketAddr, ListenError> {
    let full = if s.starts_with(':') {
        format!("127.0.0.1{s}")
    } else {
        s.to_string()
    };
    full.to_socket_addrs()
        .map_err(|e| ListenError::Invalid(e.to_string()))?
        .next()
        .ok_or(ListenError::NoAddress)
}

/// How the endpoint is exposed: `--listen` and `--token-file`.
#[derive(Args, Clone, Debug, Default)]
pub struct Exposure {
    /// Serve GET /metrics (and /healthz) on this address: HOST:PORT, or :PORT for 127.0.0.1. An address other
    /// than loopback needs --token-file
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// A file holding the bearer token a scrape of /metrics must send (`Authorization: Bearer TOKEN`); read
    /// at every scrape, so a rotated token applies at once
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub token_file: Option<PathBuf>,
}

/// Connections whose request head has not yet arrived with the token (or was answered without it) held at
/// once: a new one beyond this closes the oldest of them, so slow or silent clients cannot keep a new one out.
pub const MAX_UNAUTHENTICATED: usize = 256;
/// Of those, connections from one peer address: a new one beyond this closes that address's oldest.
pub const MAX_PER_PEER: usize = 4;
/// Connections whose request carried the token (every request when there is no token file) served at once:
/// slots of their own, which unauthenticated connections never take.
pub const MAX_AUTHENTICATED: usize = 32;
/// Time a client has from its connection to a request head that carries the token; an unauthenticated
/// connection is closed then, whatever it sent.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Time one connection may last in all.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The token in `file` (surrounding whitespace removed); an empty or unreadable file is an error.
fn read_token(file: &Path) -> Result<String, TokenError> {
    let t = std::fs::read_to_string(file).map_err(|source| TokenError::Unreadable {
        file: file.to_path_buf(),
        source,
    })?;
    let t = t.trim();
    if t.is_empty() {
        return Err(TokenError::Empty(file.to_path_buf()));
    }
    Ok(t.to_string())
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i).copied().unwrap_or(0), b.get(i).copied().unwrap_or(0));
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Serves `GET /metrics` and `GET /healthz` per `e` from a background thread (hyper's HTTP/1 server on a
/// single-threaded tokio runtime: at most [`MAX_UNAUTHENTICATED`] connections before their request
/// authenticates and [`MAX_AUTHENTICATED`] after, each with a deadline); returns the
/// bound address, or None without `--listen`. Every tenant's names and usage are in the metrics: an address
/// other than loopback is refused without a token.
pub fn serve(e: &Exposure, published: Published) -> Result<Option<SocketAddr>, AgentError> {
    let Some(addr) = e.listen else {
        return Ok(None);
    };
    match &e.token_file {
        Some(f) => {
            read_token(f)?;
        }
        None if !addr.ip().is_loopback() => return Err(AgentError::NotLoopback(addr)),
        None => {}
    }
    let listener = TcpListener::bind(addr).map_err(|source| AgentError::Listen { addr, source })?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let token = e.token_file.clone();
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || rt.block_on(accept(listener, token, published)))?;
    Ok(Some(bound))
}

async fn accept(listener: TcpListener, token: Option<PathBuf>, published: Published) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            cuquota_core::log!(Level::Error, "metrics: cannot serve: {e}");
            return;
        }
    };
    let waiting: Arc<Mutex<Waiting>> = Arc::default();
    let authenticated = Arc::new(tokio::sync::Semaphore::new(MAX_AUTHENTICATED));
    let token = Arc::new(token);
    for id in 0u64.. {
        let (stream, peer) = match listener.accept().await {
            Ok((s, a)) => (s, a.ip()),
            Err(_) => {
                // Out of descriptors or the like: let it pass rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (published, token) = (published.clone(), token.clone());
        let (w, auth) = (waiting.clone(), authenticated.clone());
        // Held by the connection's task once its request authenticated.
        let permit: Arc<Mutex<Option<tokio::sync::OwnedSemaphorePermit>>> = Arc::default();
        let held = permit.clone();
        let task = tokio::spawn(async move {
            let _leave = Leave(w.clone(), id);
            let service = service_fn(move |req: Request<Incoming>| {
                let a = check(req.headers(), token.as_deref());
                let a = match a {
                    Auth::Open | Auth::Valid => {
                        // Out of the unauthenticated pool, into the authenticated one.
                        w.lock().unwrap_or_else(|e| e.into_inner()).leave(id);
                        match auth.clone().try_acquire_owned() {
                            Ok(p) => {
                                *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                                a
                            }
                            Err(_) => Auth::Busy,
                        }
                    }
                    other => other,
                };
                let r = answer(req.method(), req.uri().path(), &a, &published);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            if tokio::time::timeout(HEADER_TIMEOUT, conn.as_mut()).await.is_ok() {
                return;
            }
            if permit.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                return; // no authenticated request in time: closed
            }
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT - HEADER_TIMEOUT, conn).await;
        });
        // Counted before it runs (one thread: the task is first polled at the yield below).
        let evict = waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(id, peer, task.abort_handle());
        if let Some(h) = evict {
            h.abort();
        }
        // Let the new connection (and every other) read before the next accept: a client sends its head at
        // once, so it is read long before the connections after it could make it the oldest.
        tokio::task::yield_now().await;
    }
}

/// The connections without an authenticated request, oldest first, and their count per peer address.
#[derive(Default)]
struct Waiting {
    order: std::collections::VecDeque<(u64, IpAddr, tokio::task::AbortHandle)>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Waiting {
    /// Counts connection `id` of `peer`; returns the connection it displaces (the peer's oldest when the peer
    /// holds [`MAX_PER_PEER`], else the oldest of all when there are [`MAX_UNAUTHENTICATED`]), to be closed.
    fn admit(
        &mut self,
        id: u64,
        peer: IpAddr,
        h: tokio::task::AbortHandle,
    ) -> Option<tokio::task::AbortHandle> {
        let victim = if self.per_peer.get(&peer).copied().unwrap_or(0) >= MAX_PER_PEER {
            self.order.iter().position(|e| e.1 == peer)
        } else if self.order.len() >= MAX_UNAUTHENTICATED {
            Some(0)
        } else {
            None
        };
        let out = victim.and_then(|i| self.remove(i));
        self.order.push_back((id, peer, h));
        *self.per_peer.entry(peer).or_default() += 1;
        out
    }

    /// Connection `id` authenticated or ended: no longer counted.
    fn leave(&mut self, id: u64) {
        if let Some(i) = self.order.iter().position(|e| e.0 == id) {
            self.remove(i);
        }
    }

    fn remove(&mut self, i: usize) -> Option<tokio::task::AbortHandle> {
        let (_, peer, h) = self.order.remove(i)?;
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&peer);
            }
        }
        Some(h)
    }
}

/// Uncounts a connection when its task ends (or is closed).
struct Leave(Arc<Mutex<Waiting>>, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).leave(self.1);
    }
}

fn reply(status: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(ctype) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

/// What a request's `Authorization` says, judged against the token file.
enum Auth {
    /// No token file: every request may read (loopback).
    Open,
    /// The file's token.
    Valid,
    /// Another token, or none.
    Invalid,
    /// The token file cannot be read or is empty: no request may read (fail closed).
    NoToken(String),
    /// Authenticated, but [`MAX_AUTHENTICATED`] connections are being served.
    Busy,
}

/// Judges `headers` against the token in `token` (read now, so a rotated token applies at once).
fn check(headers: &HeaderMap, token: Option<&Path>) -> Auth {
    let Some(file) = token else {
        return Auth::Open;
    };
    let want = match read_token(file) {
        Ok(t) => t,
        Err(e) => return Auth::NoToken(e.to_string()),
    };
    let sent = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or(b"");
    if same_secret(sent, want.as_bytes()) {
        Auth::Valid
    } else {
        Auth::Invalid
    }
}

/// The answer to one request.
fn answer(method: &Method, path: &str, auth: &Auth, published: &Published) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match path {
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/" => reply(StatusCode::OK, TEXT, "cuquota metrics: GET /metrics\n".into()),
        "/metrics" => match auth {
            Auth::Open | Auth::Valid => match published.get() {
                Some(t) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    t,
                ),
                None => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "no sample yet\n".into()),
            },
            Auth::Invalid => {
                let mut r = reply(StatusCode::UNAUTHORIZED, TEXT, "unauthorized\n".into());
                r.headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            }
            Auth::NoToken(e) => {
                // Fail closed: no token to compare with, no metrics.
                cuquota_core::log!(Level::Error, "metrics: {e}");
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "no token\n".into())
            }
            Auth::Busy => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "busy\n".into()),
        },
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_names_labels_and_units() {
        let snap = Snapshot {
            devices: vec![DeviceSample {
                labels: DeviceLabels {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "c".into(),
                    vdevice_index: "0".into(),
                    device_uuid: "GPU-1".into(),
                    name: "web".into(),
                },
                memory_used_bytes: 1 << 30,
                memory_limit_bytes: Some(2 << 30),
                memory_request_bytes: Some(1 << 30),
                memory_resident_bytes: 1 << 30,
                memory_evicted_bytes: 1 << 20,
                memory_waiting_bytes: 2 << 20,
                sm_limit_percent: Some(30),
                utilization_percent: Some(29.5),
                last_kernel_age_seconds: Some(0.5),
                gpu_seconds_total: Some(12.25),
                throttled_seconds_total: Some(3.0),
                allocation_refusals_total: Some(4),
                processes: 2,
            }],
            actions: vec![(
                ActionLabels {
                    name: "web".into(),
                    action: "kill".into(),
                    ..Default::default()
                },
                0,
            )],
            agent_passes: Some(7),
        };
        let t = render(&snap);
        let labels =
            r#"namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="GPU-1",name="web""#;
        for line in [
            format!("hami_vgpu_memory_used_bytes{{{labels}}} 1073741824.0"),
            format!("hami_vgpu_memory_limit_bytes{{{labels}}} 2147483648.0"),
            format!("hami_container_device_utilization_ratio{{{labels}}} 29.5"),
            format!("hami_container_last_kernel_elapsed_seconds{{{labels}}} 0.5"),
            format!("cuquota_sm_limit_percent{{{labels}}} 30.0"),
            format!("cuquota_achieved_share_ratio{{{labels}}} 0.295"),
            format!("cuquota_gpu_seconds_total{{{labels}}} 12.25"),
            format!("cuquota_throttled_seconds_total{{{labels}}} 3.0"),
            format!("cuquota_processes{{{labels}}} 2.0"),
            format!("cuquota_allocation_refusals_total{{{labels}}} 4.0"),
            format!("cuquota_memory_request_bytes{{{labels}}} 1073741824.0"),
            format!("cuquota_memory_resident_bytes{{{labels}}} 1073741824.0"),
            format!("cuquota_memory_evicted_bytes{{{labels}}} 1048576.0"),
            format!("cuquota_memory_waiting_bytes{{{labels}}} 2097152.0"),
            format!("cuquota_memory_restoring_bytes{{{labels}}} 0.0"),
            format!("cuquota_wakeup_latency_seconds_count{{{labels}}} 0"),
            "# TYPE cuquota_wakeup_latency_seconds histogram".into(),
            r#"cuquota_agent_actions_total{namespace="",pod="",container="",name="web",action="kill"} 0"#
                .into(),
            "cuquota_agent_passes_total 7".into(),
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in\n{t}");
        }
        assert!(t.ends_with("# EOF\n"));
        // No limit, no kernel yet: those series are absent rather than 0.
        let mut s = snap.clone();
        s.devices[0].memory_limit_bytes = None;
        s.devices[0].memory_request_bytes = None;
        s.devices[0].last_kernel_age_seconds = None;
        let t = render(&s);
        assert!(
            !t.contains("hami_vgpu_memory_limit_bytes{")
                && !t.contains("last_kernel_elapsed_seconds{")
                && !t.contains("cuquota_memory_request_bytes{"),
            "{t}"
        );
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("127.0.0.1:9400").unwrap().port(), 9400);
        assert!(
            parse_listen(":9400").unwrap().ip().is_loopback(),
            "loopback unless named"
        );
        assert!(parse_listen("0.0.0.0:9400").unwrap().ip().is_unspecified());
        assert!(parse_listen("9400").is_err());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3creT"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"", b"s3cret"));
    }

    #[test]
    fn metrics_need_the_token_and_health_does_not() {
        let dir = std::env::temp_dir().join(format!("cuquota-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "abc123\n").unwrap();
        let p = Published::default();
        p.set("m 1\n".into());
        let get = |path: &str, auth: Option<&str>, token: Option<&Path>| {
            let mut h = HeaderMap::new();
            if let Some(a) = auth {
                h.insert(AUTHORIZATION, HeaderValue::from_str(a).unwrap());
            }
            answer(&Method::GET, path, &check(&h, token), &p).status()
        };
        assert_eq!(
            get("/metrics", None, None),
            StatusCode::OK,
            "no token file: open (loopback)"
        );
        assert_eq!(get("/metrics", None, Some(&file)), StatusCode::UNAUTHORIZED);
        assert_eq!(
            get("/metrics", Some("Bearer abc12"), Some(&file)),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get("/metrics", Some("Basic abc123"), Some(&file)),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get("/metrics", Some("Bearer abc123"), Some(&file)),
            StatusCode::OK
        );
        assert_eq!(get("/healthz", None, Some(&file)), StatusCode::OK);
        assert_eq!(get("/other", None, Some(&file)), StatusCode::NOT_FOUND);
        // The file rotated: the new token at once; an empty file: nothing (fail closed).
        std::fs::write(&file, "new").unwrap();
        assert_eq!(
            get("/metrics", Some("Bearer abc123"), Some(&file)),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(get("/metrics", Some("Bearer new"), Some(&file)), StatusCode::OK);
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            get("/metrics", Some("Bearer "), Some(&file)),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let h = HeaderMap::new();
        assert_eq!(
            answer(&Method::POST, "/metrics", &check(&h, None), &p).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
