//! The driver's API calls (kube-rs) against an in-test HTTP stub of just the endpoints it uses — no API server
//! runs on these machines: the ResourceClaim read (GET) and the ResourceSlice publish (server-side apply PATCH).
//! What the client sends is validated against Kubernetes 1.37's schema (`kubernetes-validate --strict`).

use shim_tests::containers::kubernetes_validate;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cuquota_dra::inventory::{Gpu, Inventory};
use cuquota_dra::kube_api::KubeSource;
use cuquota_dra::slice_sync::{SliceSync, Synced};
use cuquota_dra::source::ClaimSource;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// Requests the stub saw: (method, path and query, content type, body).
type Seen = Arc<Mutex<Vec<(String, String, String, String)>>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

async fn stub(req: Request<hyper::body::Incoming>, seen: Seen) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let ctype = req
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    seen.lock()
        .unwrap()
        .push((method.clone(), uri.clone(), ctype, body.clone()));
    let path = uri.split('?').next().unwrap_or("");
    let (status, out) = match (method.as_str(), path) {
        ("GET", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/notebook-gpu") => (
            200,
            std::fs::read_to_string(root().join("dra/tests/fixtures/claim.json")).unwrap(),
        ),
        ("GET", "/api/v1/nodes/node-1") => (
            200,
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"9d2b8c1e-0000-4000-8000-00000000a0de"}}"#
                .to_string(),
        ),
        // Server-side apply: the stored object is what was applied.
        ("PATCH", p) if p.starts_with("/apis/resource.k8s.io/v1/resourceslices/") => (200, body),
        _ => (
            404,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not found"}"#
                .to_string(),
        ),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(out)))
        .unwrap())
}

#[test]
fn the_client_reads_claims_and_publishes_a_valid_slice_through_the_api() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let (client, inv) = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |r| stub(r, s.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let inv = Inventory {
            pool: "node-1".into(),
            gpus: vec![Gpu::new(
                "GPU-0badc0de-1111-2222-3333-444455556666",
                80 << 30,
                "NVIDIA H100 80GB HBM3",
            )
            .unwrap()],
        };
        (client, inv)
    });

    // Publish: the slice is not there (GET 404), so one server-side apply of it, by the plugin's field manager.
    let mut sync = SliceSync::new(client.clone(), "gpu.cuquota.io", inv.clone());
    assert_eq!(rt.block_on(sync.sync()), Ok(Synced::Created(1)));
    let sent = seen.lock().unwrap().clone();
    let (method, uri, ctype, body) = sent.last().unwrap().clone();
    assert_eq!(method, "PATCH");
    assert!(
        uri.starts_with("/apis/resource.k8s.io/v1/resourceslices/node-1-gpu.cuquota.io?"),
        "{uri}"
    );
    assert!(
        uri.contains("fieldManager=cuquota-dra-plugin") && uri.contains("force=true"),
        "{uri}"
    );
    assert_eq!(ctype, "application/apply-patch+yaml");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["spec"]["devices"][0]["capacity"]["memory"]["value"], "80Gi");
    assert_eq!(v["spec"]["devices"][0]["allowMultipleAllocations"], true);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("sent-slice.json");
    std::fs::write(&f, &body).unwrap();
    let (ok, out) = kubernetes_validate(&[&f]);
    assert!(
        ok && out.contains("passed for resource resourceslice/node-1-gpu.cuquota.io"),
        "{out}"
    );

    // An unhealthy GPU's taint fits the schema too.
    let mut sync = SliceSync::new(client.clone(), "gpu.cuquota.io", inv.clone());
    sync.set_unhealthy(&[(inv.gpus[0].name.clone(), "xid-79".into())]);
    assert_eq!(rt.block_on(sync.sync()), Ok(Synced::Created(1)));
    let body = seen.lock().unwrap().last().unwrap().3.clone();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let t = &v["spec"]["devices"][0]["taints"][0];
    assert_eq!(
        (&t["key"], &t["value"], &t["effect"]),
        (
            &"gpu.cuquota.io/unhealthy".into(),
            &"xid-79".into(),
            &"NoSchedule".into()
        ),
        "{t}"
    );
    std::fs::write(&f, &body).unwrap();
    let (ok, out) = kubernetes_validate(&[&f]);
    assert!(ok, "{out}");

    // Read: the claim comes back with its allocation, and grants what the fixture says.
    let src = KubeSource(client);
    let claim = rt.block_on(src.get("team-a", "notebook-gpu")).unwrap();
    assert_eq!(claim.metadata.uid, "5b9c3f2e-1d4a-4c8e-9f00-0a1b2c3d4e5f");
    let g = claim.grants("gpu.cuquota.io", &inv).unwrap();
    assert_eq!((g.devices[0].memory, g.devices[0].sm), (4 << 30, Some(30)));
    assert_eq!(
        g.pods,
        vec![(
            "notebook-0".to_string(),
            "aaaabbbb-cccc-dddd-eeee-ffff00001111".to_string()
        )]
    );
    // A claim the server does not have is an error naming it.
    let e = rt.block_on(src.get("team-a", "gone")).unwrap_err().to_string();
    assert!(e.contains("team-a/gone") && e.contains("not found"), "{e}");
}
