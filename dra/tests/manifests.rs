//! Every Kubernetes object of the driver is valid against Kubernetes 1.37's OpenAPI schema
//! (`kubernetes-validate --strict`, installed into .deps/k8s by scripts/setup.sh): the manifests in dra/deploy/,
//! the ResourceClaim the tests prepare, and the ResourceSlice the plugin generates for a node (GPUs from NVML —
//! here the simulator's — or from `--gpu`).

use shim_tests::containers::kubernetes_validate;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn plugin(args: &[&str], env: &[(&str, String)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cuquota-dra-plugin"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_object_is_valid_kubernetes_1_37() {
    let dir = tempfile::tempdir().unwrap();
    // The slice from --gpu, and from NVML (the simulator: 2 GPUs of 80 GiB and 16 GiB).
    let from_args = plugin(
        &[
            "--node",
            "node-1",
            "--gpu",
            "GPU-0badc0de-1111-2222-3333-444455556666=80Gi=NVIDIA H100 80GB HBM3",
            "--print-resource-slice",
        ],
        &[],
    );
    let sim_state = dir.path().join("sim.state");
    let from_nvml = plugin(
        &["--node", "node-2", "--print-resource-slice"],
        &[
            ("CUQUOTA_LIBNVML", shim_tests::sim_lib().display().to_string()),
            ("CUDASIM_STATE", sim_state.display().to_string()),
            ("CUDASIM_DEVICES", "2".into()),
            ("CUDASIM_MEMORY", "80g,16g".into()),
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&from_nvml).unwrap();
    let devs = v["spec"]["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2, "{from_nvml}");
    assert_eq!(devs[0]["capacity"]["memory"]["value"], "80Gi");
    assert_eq!(devs[1]["capacity"]["memory"]["value"], "16Gi");
    assert_eq!(devs[1]["allowMultipleAllocations"], true);
    assert_eq!(v["spec"]["pool"]["name"], "node-2");
    let mut files = Vec::new();
    for (name, text) in [("slice-args.json", &from_args), ("slice-nvml.json", &from_nvml)] {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        files.push(p);
    }
    for f in std::fs::read_dir(root().join("dra/deploy")).unwrap().flatten() {
        // The kustomization is kustomize's, not the API server's: kubernetes_kustomization_* renders it.
        if f.file_name() != "kustomization.yaml" {
            files.push(f.path());
        }
    }
    files.push(root().join("dra/tests/fixtures/claim.json"));
    files.sort();
    let (ok, out) = kubernetes_validate(&files);
    assert!(ok, "kubernetes-validate rejected:\n{out}");
    for want in [
        "resourceslice/node-1-gpu.cuquota.io",
        "resourceslice/node-2-gpu.cuquota.io",
        "deviceclass/gpu.cuquota.io",
        "resourceclaimtemplate/notebook-gpu",
        "pod/notebook-0",
        "daemonset/cuquota-dra-plugin",
        "clusterrole/cuquota-dra-plugin",
        "resourceclaim/notebook-gpu",
        "validatingadmissionpolicy/cuquota-dra-plugin-own-node-slices",
        "validatingadmissionpolicybinding/cuquota-dra-plugin-own-node-slices",
        "validatingadmissionpolicy/cuquota-gpu-claim-parameters",
        "validatingadmissionpolicy/cuquota-gpu-claim-template-parameters",
    ] {
        assert!(
            out.contains(&format!("passed for resource {want} ")),
            "{want} not checked:\n{out}"
        );
    }

    // The validator can fail: a misspelt field of the slice is refused.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        from_args.replace("allowMultipleAllocations", "allowMultipleAllocation"),
    )
    .unwrap();
    let (ok, out) = kubernetes_validate(&[bad]);
    assert!(
        !ok && out.contains("allowMultipleAllocation"),
        "a misspelt field must be refused:\n{out}"
    );
}

/// `kubectl kustomize DIR`: (success, output).
fn kustomize(dir: &Path) -> (bool, String) {
    let out = Command::new("kubectl")
        .args(["kustomize", dir.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e} (scripts/setup.sh kubectl installs Debian's, as root)"));
    let err = String::from_utf8_lossy(&out.stderr);
    (
        out.status.success(),
        format!("{}{err}", String::from_utf8_lossy(&out.stdout)),
    )
}

#[test]
fn kubernetes_kustomization_installs_agent_plugin_and_class_with_the_image_one_setting() {
    let dir = tempfile::tempdir().unwrap();
    // An operator's overlay: the install, with the image moved to their registry in one place.
    let overlay = dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    // kustomize takes only relative roots: up to `/`, then down to the repository's deploy/.
    let overlay = overlay.canonicalize().unwrap();
    let up = "../".repeat(overlay.components().count() - 1);
    let base = format!("{up}{}", root().join("deploy").canonicalize().unwrap().display());
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources: [{}]\nimages:\n- name: registry.example.com/cuquota\n  newName: my.registry/gpu/cuquota\n  newTag: \"9.9\"\n",
            base.replace("//", "/")
        ),
    )
    .unwrap();
    for (kdir, image) in [
        (root().join("deploy"), "registry.example.com/cuquota:0.1.0"),
        (overlay, "my.registry/gpu/cuquota:9.9"),
    ] {
        let (ok, out) = kustomize(&kdir);
        assert!(ok, "kubectl kustomize {} failed:\n{out}", kdir.display());
        let images: Vec<&str> = out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: "))
            .filter(|i| !i.contains("kube-rbac-proxy"))
            .collect();
        // The agent (its installer and itself), the plugin (its installer and itself).
        assert_eq!(images, [image; 4], "{out}");
        let rendered = dir.path().join("rendered.yaml");
        std::fs::write(&rendered, &out).unwrap();
        let (ok, v) = kubernetes_validate(&[&rendered]);
        assert!(ok, "kubernetes-validate rejected the rendered install:\n{v}");
        for want in [
            "namespace/cuquota-system",
            "daemonset/cuquota-agent",
            "daemonset/cuquota-dra-plugin",
            "clusterrole/cuquota-dra-plugin",
            "deviceclass/gpu.cuquota.io",
            "validatingadmissionpolicy/cuquota-dra-plugin-own-node-slices",
            "validatingadmissionpolicybinding/cuquota-gpu-claim-parameters",
        ] {
            assert!(
                v.contains(&format!("passed for resource {want} ")),
                "{want} not rendered:\n{v}"
            );
        }
    }
}

#[test]
fn the_plugin_pod_gets_nvml_as_nvidias_plugin_does_and_sees_the_node_read_only() {
    let text = std::fs::read_to_string(root().join("dra/deploy/plugin.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_string)
    };
    // The NVIDIA runtime injects NVML only into a container that names GPUs.
    assert_eq!(env("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("all"));
    assert_eq!(env("NVIDIA_DRIVER_CAPABILITIES").as_deref(), Some("utility"));
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let host_root = args
        .iter()
        .find_map(|a| a.strip_prefix("--host-root="))
        .expect("--host-root: the plugin looks for the driver's files on the node");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == host_root)
        .unwrap_or_else(|| panic!("no mount at {host_root}"));
    assert_eq!(mount["readOnly"], true, "{mount}");
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(vol["hostPath"]["path"], "/", "{vol}");
    // Surge rolling updates: the new pod beside the old, its sockets named after its UID.
    let ru = &ds["spec"]["updateStrategy"];
    assert_eq!(ru["type"], "RollingUpdate");
    assert_eq!(ru["rollingUpdate"]["maxSurge"], 1, "{ru}");
    assert_eq!(ru["rollingUpdate"]["maxUnavailable"], 0, "{ru}");
    let uid = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_UID")
        .expect("POD_UID: the sockets are named after the pod");
    assert_eq!(uid["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
    // Probes on the port --health-listen serves: /healthz for liveness, /readyz (registered) for readiness.
    let listen = args
        .iter()
        .find_map(|a| a.strip_prefix("--health-listen="))
        .expect("--health-listen: the probes' endpoint");
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "health")
        .expect("a port named health");
    assert!(
        listen.ends_with(&format!(":{}", port["containerPort"])),
        "{listen} {port}"
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "health");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "health");
    // The binary takes every argument the manifest gives it.
    let mut all: Vec<&str> = args.clone();
    all.extend([
        "--node",
        "n",
        "--gpu",
        "GPU-0badc0de-1111-2222-3333-444455556666=80Gi",
        "--print-resource-slice",
    ]);
    plugin(&all, &[]);
}

#[test]
fn a_node_can_publish_the_sm_share_under_hamis_name_cores() {
    let slice = |extra: &[&str]| {
        let mut args = vec![
            "--node",
            "node-1",
            "--gpu",
            "GPU-0badc0de-1111-2222-3333-444455556666=80Gi",
            "--print-resource-slice",
        ];
        args.extend(extra);
        let text = plugin(&args, &[]);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        (v["spec"]["devices"][0]["capacity"].clone(), text)
    };
    let (ours, _) = slice(&[]);
    assert!(ours["sm"].is_object() && ours["cores"].is_null(), "{ours}");
    let (hami, text) = slice(&["--sm-capacity-name", "cores"]);
    // One name, never both: the scheduler would sum them apart and grant the SM time twice.
    assert!(hami["cores"].is_object() && hami["sm"].is_null(), "{hami}");
    assert_eq!(hami["cores"], ours["sm"]);
    assert_eq!(hami["memory"], ours["memory"]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("slice.json");
    std::fs::write(&p, text).unwrap();
    let (ok, out) = kubernetes_validate(&[p]);
    assert!(ok, "{out}");
}

/// The slice from NVML describes each GPU as NVIDIA's DRA driver does (productName, architecture,
/// cudaComputeCapability and driverVersion as semantic versions, the PCI address) and upstream's standard
/// `resource.kubernetes.io/pciBusID` and `pcieRoot`, the root found in the node's sysfs under --host-root.
#[test]
fn the_slice_describes_each_gpu_from_nvml() {
    let dir = tempfile::tempdir().unwrap();
    // A node's sysfs: the simulator's first GPU (0000:18:00.0) under root complex pci0000:17.
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0")).unwrap();
    std::fs::create_dir_all(host.join("sys/bus/pci/devices")).unwrap();
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0",
        host.join("sys/bus/pci/devices/0000:18:00.0"),
    )
    .unwrap();
    let out = plugin(
        &[
            "--node",
            "n",
            "--print-resource-slice",
            "--host-root",
            host.to_str().unwrap(),
        ],
        &[
            ("CUQUOTA_LIBNVML", shim_tests::sim_lib().display().to_string()),
            (
                "CUDASIM_STATE",
                dir.path().join("sim.state").display().to_string(),
            ),
            ("CUDASIM_DEVICES", "2".into()),
            ("CUDASIM_MEMORY", "80g,16g".into()),
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &v["spec"]["devices"][0]["attributes"];
    assert_eq!(
        a["productName"]["string"], "NVIDIA H100 80GB HBM3 (cudasim)",
        "{out}"
    );
    assert_eq!(a["architecture"]["string"], "Hopper", "{out}");
    assert_eq!(a["cudaComputeCapability"]["version"], "9.0.0", "{out}");
    // The simulator's default driver is CUDA 13.0's, 580.82.07.
    assert_eq!(a["driverVersion"]["version"], "580.82.7", "{out}");
    assert_eq!(a["pcieBusID"]["string"], "0000:18:00.0", "{out}");
    assert_eq!(
        a["resource.kubernetes.io/pciBusID"]["string"], "0000:18:00.0",
        "{out}"
    );
    assert_eq!(
        a["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:17",
        "{out}"
    );
    // The second GPU is not in this sysfs: no root is guessed for it.
    let b = &v["spec"]["devices"][1]["attributes"];
    assert_eq!(
        b["resource.kubernetes.io/pciBusID"]["string"], "0000:28:00.0",
        "{out}"
    );
    assert!(b.get("resource.kubernetes.io/pcieRoot").is_none(), "{out}");
}
