//! The Kubernetes examples (examples/kubernetes/) are valid against the Kubernetes schemas (`kubernetes-validate
//! --strict`, from PyPI with its schemas bundled: no network) and say what cuquota needs: the agent sees host
//! pids and serves metrics, a pod mounts the library, /etc/ld.so.preload and its limits read-only.
//! The validator is installed into .deps/k8s by the setup step (scripts/setup.sh), never by this test.

use shim_tests::containers::kubernetes_validate;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every Kubernetes manifest under examples/kubernetes (Helm values files are not manifests).
fn manifests() -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().unwrap() != "helm-values.yaml"
                // kustomize's, rendered and validated by dra/tests/manifests.rs
                && p.file_name().unwrap() != "kustomization.yaml"
            {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("examples/kubernetes"), &mut out);
    out.sort();
    out
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The line after `mountPath: <path>` says `readOnly: true`.
fn mounted_read_only(yaml: &str, path: &str) -> bool {
    let lines: Vec<&str> = yaml.lines().map(str::trim).collect();
    lines
        .windows(2)
        .any(|w| w[0] == format!("mountPath: {path}") && w[1] == "readOnly: true")
}

#[test]
fn manifests_are_valid_kubernetes() {
    let files = manifests();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    for want in [
        "examples/kubernetes/agent.yaml",
        "examples/kubernetes/pod.yaml",
        "examples/kubernetes/hami/pod.yaml",
        "examples/kubernetes/kai/pod.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    let (ok, out) = kubernetes_validate(&files);
    assert!(ok, "kubernetes-validate rejected the examples:\n{out}");
    assert_eq!(
        out.matches(" passed for resource ").count(),
        11, // agent.yaml: namespace, service account, DaemonSet, Service, the proxy's and the reader's RBAC
        "every resource checked:\n{out}"
    );

    // The validator can fail: a misspelt field is refused.
    let bad = std::env::temp_dir().join(format!("cuquota-k8s-bad-{}.yaml", std::process::id()));
    std::fs::write(
        &bad,
        read("examples/kubernetes/pod.yaml").replace("readOnly: true", "readOnyl: true"),
    )
    .unwrap();
    let (ok, out) = kubernetes_validate(std::slice::from_ref(&bad));
    let _ = std::fs::remove_file(&bad);
    assert!(
        !ok && out.contains("readOnyl"),
        "a misspelt field must be refused:\n{out}"
    );
}

#[test]
fn manifests_say_what_cuquota_needs() {
    let agent = read("examples/kubernetes/agent.yaml");
    for s in [
        "hostPID: true",
        "- agent",
        "- --listen",
        "- 127.0.0.1:9400",
        "--upstream=http://127.0.0.1:9400/",
        "containerPort: 8443",
        "nonResourceURLs: [\"/metrics\"]",
        "path: /var/lib/cuquota",
        "NVIDIA_DRIVER_CAPABILITIES",
    ] {
        assert!(agent.contains(s), "agent.yaml lacks `{s}`");
    }
    for s in ["mountPath: /sys/fs/cgroup", "\"KILL\""] {
        assert!(agent.contains(s), "agent.yaml lacks `{s}` (enforcement)");
    }
    assert!(
        !mounted_read_only(&agent, "/sys/fs/cgroup"),
        "sm = \"throttle\" writes the cgroup freezer: the agent's cgroup mount must be writable"
    );

    let pod = read("examples/kubernetes/pod.yaml");
    for p in [
        "/etc/ld.so.preload",
        "/etc/cuquota/limits",
        "/usr/local/cuquota/libcuquota.so",
    ] {
        assert!(mounted_read_only(&pod, p), "pod.yaml must mount {p} read-only");
    }
    assert!(
        !mounted_read_only(&pod, "/var/run/cuquota"),
        "the usage directory is writable"
    );
    assert!(pod.contains("CUQUOTA_USAGE_FILE"));

    assert!(read("examples/kubernetes/hami/pod.yaml").contains("nvidia.com/gpumem: 3000"));
    assert!(read("examples/kubernetes/kai/pod.yaml").contains("gpu-fraction: \"0.5\""));
    // cuquota's own image is assembled by scripts/image.sh (no base image can be pulled here).
    for d in [
        "scripts/image.sh",
        "examples/kubernetes/hami/Dockerfile",
        "examples/kubernetes/kai/Dockerfile",
    ] {
        assert!(
            read(d).contains("dist/libcuquota.so"),
            "{d} ships the portable library"
        );
    }
    assert!(read("examples/kubernetes/hami/Dockerfile").contains("/k8s-vgpu/lib/nvidia/libvgpu.so"));
    assert!(read("examples/kubernetes/kai/Dockerfile").contains("/artifacts/libvgpu.so"));
}
