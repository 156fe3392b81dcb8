//! Probes and metrics over HTTP (`--health-listen`): `GET /healthz` (liveness: answered by the runtime that
//! serves the kubelet, so a plugin whose runtime is stuck fails it), `GET /readyz` (readiness: the kubelet has
//! registered the plugin) and `GET /metrics` (OpenMetrics text, rendered with `prometheus-client` as the
//! agent's are, agent/src/metrics.rs).
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `cuquota_dra_operations_total` | counter | claims prepared or unprepared, by `operation` (`prepare`, `unprepare`) |
//! | `cuquota_dra_operation_failures_total` | counter | of those, the ones answered with an error |
//! | `cuquota_dra_operation_duration_seconds` | histogram | the time each took |
//! | `cuquota_dra_registered` | gauge | 1 once the kubelet has registered the plugin |
//!
//! The series name no claim or tenant (counts and times only), so the endpoint may listen beyond loopback
//! without a token, as the kubelet's probes need.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
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

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16;
/// Time a connection has to send its request head, and to be answered in all.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The operation a series counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// `prepare` or `unprepare`.
    pub operation: &'static str,
}

/// The plugin's counters, and whether the kubelet registered it.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    operations: Family<OpLabels, Counter>,
    failures: Family<OpLabels, Counter>,
    durations: Family<OpLabels, Histogram>,
    registered: Gauge,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut reg = Registry::default();
        let operations = Family::<OpLabels, Counter>::default();
        let failures = Family::<OpLabels, Counter>::default();
        // 1 ms … 16 s: a prepare reads the claim from the API server and writes a few files.
        let durations = Family::<OpLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 15))) as fn() -> Histogram,
        );
        let registered = Gauge::default();
        reg.register(
            "cuquota_dra_operations",
            "Claims prepared or unprepared",
            operations.clone(),
        );
        reg.register(
            "cuquota_dra_operation_failures",
            "Claims whose prepare or unprepare was answered with an error",
            failures.clone(),
        );
        reg.register(
            "cuquota_dra_operation_duration_seconds",
            "Time one claim's prepare or unprepare took",
            durations.clone(),
        );
        reg.register(
            "cuquota_dra_registered",
            "1 once the kubelet has registered the plugin",
            registered.clone(),
        );
        Metrics {
            registry: Mutex::new(reg),
            operations,
            failures,
            durations,
            registered,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Counts one claim's `operation`, failed or not, that took `took`.
    pub fn observe(&self, operation: &'static str, failed: bool, took: Duration) {
        let l = OpLabels { operation };
        self.operations.get_or_create(&l).inc();
        if failed {
            self.failures.get_or_create(&l).inc();
        }
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// The kubelet's answer to the registration.
    pub fn set_registered(&self, registered: bool) {
        self.registered.set(i64::from(registered));
        self.ready.store(registered, Ordering::Release);
    }

    /// Whether the kubelet has registered the plugin.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

/// The answer to one request.
pub fn answer(method: &Method, path: &str, m: &Metrics) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match path {
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if m.ready() => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not registered with the kubelet\n".into(),
        ),
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            m.render(),
        ),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

/// Binds `addr` (errors name it); the caller serves it with [`serve`] on the runtime that serves the kubelet.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("--health-listen {addr}: {e}")))?;
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// Serves `listener` for ever: at most [`MAX_CONNECTIONS`] at once, each closed after [`TIMEOUT`].
pub async fn serve(listener: tokio::net::TcpListener, m: Arc<Metrics>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or the like: let it pass rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let m = m.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req: Request<Incoming>| {
                let r = answer(req.method(), req.uri().path(), &m);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(TIMEOUT, conn).await;
        });
    }
}
