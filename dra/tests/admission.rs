//! The admission policies (dra/deploy/admission.yaml; their schema is checked by
//! `every_object_is_valid_kubernetes_1_37`). No CEL evaluator runs here: these tests check that the rules name
//! the plugin's own service account and upstream's node-name claim, and that the claim-parameter rules accept
//! exactly what the plugin's parser (dra/src/claim.rs) accepts, value by value.

use std::path::Path;

use cuquota_dra::claim::{GpuConfig, ResourceClaim};
use cuquota_dra::inventory::{Gpu, Inventory};

const GPU: &str = "GPU-0badc0de-1111-2222-3333-444455556666";

fn docs(file: &str) -> Vec<serde_json::Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file);
    serde_saphyr::from_multiple(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn policy<'a>(docs: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    let p = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no policy {name}"));
    let bound = docs.iter().any(|d| {
        d["kind"] == "ValidatingAdmissionPolicyBinding"
            && d["spec"]["policyName"] == name
            && d["spec"]["validationActions"] == serde_json::json!(["Deny"])
    });
    assert!(bound, "{name} has no Deny binding");
    assert_eq!(p["spec"]["failurePolicy"], "Fail", "{name}");
    p
}

fn expressions(p: &serde_json::Value) -> Vec<String> {
    p["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["expression"].as_str().unwrap().trim().to_string())
        .collect()
}

#[test]
fn each_nodes_plugin_may_write_only_its_own_nodes_slices() {
    let docs = docs("admission.yaml");
    let p = policy(&docs, "cuquota-dra-plugin-own-node-slices");
    let rule = &p["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], serde_json::json!(["resourceslices"]));
    assert_eq!(
        rule["operations"],
        serde_json::json!(["CREATE", "UPDATE", "DELETE"])
    );
    // It applies to the plugin's service account, as the DaemonSet runs it.
    let plugin = docs_of_plugin();
    let ds = plugin.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let user = format!(
        "system:serviceaccount:{}:{}",
        ds["metadata"]["namespace"].as_str().unwrap(),
        ds["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
    );
    let cond = p["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(
        cond.contains(&format!("\"{user}\"")),
        "{cond} does not name {user}"
    );
    let var = |name: &str| {
        p["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()["expression"]
            .as_str()
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(
        var("userNodeName"),
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
    );
    assert_eq!(
        var("objectNodeName"),
        "(request.operation == \"DELETE\" ? oldObject : object).spec.?nodeName.orValue(\"\")"
    );
    let v = expressions(p);
    assert!(v.contains(&"variables.userNodeName != \"\"".to_string()), "{v:?}");
    assert!(
        v.contains(&"variables.userNodeName == variables.objectNodeName".to_string()),
        "{v:?}"
    );
    // The plugin's own slice passes: it names its node in spec.nodeName.
    let inv = Inventory {
        pool: "node-7".into(),
        gpus: vec![Gpu::new(GPU, 80 << 30, "x").unwrap()],
    };
    let slice = cuquota_dra::slice::resource_slice("gpu.cuquota.io", &inv, 1);
    assert_eq!(slice["spec"]["nodeName"], "node-7");
}

fn docs_of_plugin() -> Vec<serde_json::Value> {
    docs("plugin.yaml")
}

/// The string list after `marker` in `expr` (`["a", "b"]`).
fn list_after(expr: &str, marker: &str) -> Vec<String> {
    let rest = &expr[expr
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in {expr}"))
        + marker.len()..];
    let inner = &rest[rest.find('[').unwrap() + 1..rest.find(']').unwrap()];
    inner
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .collect()
}

/// The plugin's verdict on `params` as a claim's configuration: Err(message) when its parser refuses them
/// (the class's bounds, which admission cannot see, are not a refusal of the syntax).
fn plugin_verdict(params: serde_json::Value) -> Result<(), String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/claim.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    v["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] = params;
    let rc: ResourceClaim = serde_json::from_value(v).unwrap();
    let inv = Inventory {
        pool: "node-1".into(),
        gpus: vec![Gpu::new(GPU, 80 << 30, "x").unwrap()],
    };
    match rc.grants("gpu.cuquota.io", &inv).map_err(|e| e.to_string()) {
        Err(e) if !e.contains("than its class") => Err(e),
        _ => Ok(()),
    }
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut p = serde_json::json!({"apiVersion": "gpu.cuquota.io/v1alpha1", "kind": "GpuConfig"});
    p[field] = value;
    p
}

#[test]
fn the_claim_parameter_rules_accept_what_the_plugin_accepts() {
    let docs = docs("admission.yaml");
    let claims = policy(&docs, "cuquota-gpu-claim-parameters");
    let templates = policy(&docs, "cuquota-gpu-claim-template-parameters");
    assert_eq!(
        claims["spec"]["validations"], templates["spec"]["validations"],
        "claims and their templates get the same rules"
    );
    let var = |p: &serde_json::Value| {
        p["spec"]["variables"][0]["expression"]
            .as_str()
            .unwrap()
            .trim()
            .to_string()
    };
    assert!(
        var(claims).starts_with("object.spec.?devices.?config"),
        "{}",
        var(claims)
    );
    assert!(
        var(templates).starts_with("object.spec.spec.?devices.?config"),
        "{}",
        var(templates)
    );
    for v in [var(claims), var(templates)] {
        assert!(
            v.contains("c.?opaque.?driver.orValue(\"\") == \"gpu.cuquota.io\""),
            "{v}"
        );
        assert!(v.ends_with(".map(c, c.opaque.parameters)"), "{v}");
    }
    let rules = expressions(claims);
    let rule = |needle: &str| {
        rules
            .iter()
            .find(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("no rule with {needle}: {rules:?}"))
            .clone()
    };

    // The type fields.
    let types = rule("p.?apiVersion");
    assert!(
        types.contains("\"gpu.cuquota.io/v1alpha1\"") && types.contains("\"GpuConfig\""),
        "{types}"
    );
    assert!(
        plugin_verdict(serde_json::json!({"apiVersion": "gpu.cuquota.io/v1", "kind": "GpuConfig"})).is_err()
    );

    // The known fields: exactly GpuConfig's.
    let known = list_after(&rule("p.all(k, k in"), "k in");
    let full = GpuConfig {
        api_version: "a".into(),
        kind: "k".into(),
        policy: Some("hard".into()),
        priority: Some("low".into()),
        reserved_memory: Some("1Gi".into()),
        weight: Some(1),
        memory_limit: Some("16Gi".into()),
    };
    let mut fields: Vec<String> = serde_json::to_value(full)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    fields.sort();
    let mut sorted = known.clone();
    sorted.sort();
    assert_eq!(sorted, fields);
    let e = plugin_verdict(with("memory", "4Gi".into())).unwrap_err();
    assert!(e.contains("unknown field"), "{e}");

    // policy and priority: the lists (after CEL's trim().lowerAscii()) against the plugin's parser.
    for (field, candidates) in [
        (
            "policy",
            &[
                "hard", "force", "burst", "default", "disabled", "disable", "soft", " Hard ",
            ][..],
        ),
        ("priority", &["high", "low", "0", "1", "2", "medium", "HIGH"][..]),
    ] {
        let r = rule(&format!("p.{field}.trim().lowerAscii() in"));
        let list = list_after(&r, "lowerAscii() in");
        for c in candidates {
            let admitted = list.contains(&c.trim().to_ascii_lowercase());
            let plugin = plugin_verdict(with(field, (*c).into()));
            assert_eq!(
                admitted,
                plugin.is_ok(),
                "{field} {c:?}: admission {admitted}, plugin {plugin:?}"
            );
        }
        // Not a string: refused by both.
        assert!(r.contains(&format!("type(p.{field}) == string")), "{r}");
        assert!(plugin_verdict(with(field, 1.into())).is_err());
    }

    // weight: an integer within the bounds the rule names.
    let r = rule("p.weight >=");
    assert!(r.contains("type(p.weight) == int"), "{r}");
    let bound = |op: &str| -> i64 {
        let rest = &r[r.find(op).unwrap() + op.len()..];
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (lo, hi) = (bound("p.weight >="), bound("p.weight <="));
    for w in [lo - 1, lo, hi, hi + 1] {
        let admitted = (lo..=hi).contains(&w);
        let plugin = plugin_verdict(with("weight", w.into()));
        assert_eq!(
            admitted,
            plugin.is_ok(),
            "weight {w}: admission {admitted}, plugin {plugin:?}"
        );
    }
    assert!(plugin_verdict(with("weight", 10.5.into())).is_err());
    assert!(plugin_verdict(with("weight", "10".into())).is_err());

    // reservedMemory: a quantity, not negative (Kubernetes' isQuantity/quantity()); the plugin the same.
    let r = rule("isQuantity(p.reservedMemory");
    assert!(
        r.contains("type(p.reservedMemory) == string") && r.contains(".sign() >= 0"),
        "{r}"
    );
    for (q, ok) in [
        ("2Gi", true),
        ("0", true),
        ("1.5Gi", true),
        ("-1Gi", false),
        ("lots", false),
    ] {
        assert_eq!(
            plugin_verdict(with("reservedMemory", q.into())).is_ok(),
            ok,
            "reservedMemory {q}"
        );
    }
    // memoryLimit: the same quantity rule (whether it may exceed the grant is the class's, which admission
    // cannot see).
    let r = rule("isQuantity(p.memoryLimit");
    assert!(
        r.contains("type(p.memoryLimit) == string") && r.contains(".sign() >= 0"),
        "{r}"
    );
    for (q, ok) in [("16Gi", true), ("-1Gi", false), ("lots", false)] {
        assert_eq!(
            plugin_verdict(with("memoryLimit", q.into())).is_ok(),
            ok,
            "memoryLimit {q}"
        );
    }
    assert!(plugin_verdict(with("memoryLimit", 16.into())).is_err());
}
