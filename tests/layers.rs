//! The shim's module graph points one way: abi → hooks → state → policy (memory, throttle) → devices → driver →
//! ffi, with `locks`, `log` and `time` as leaves anyone may use (DESIGN.md, "Dependency arrows"). This test reads every
//! `crate::` / `$crate::` / `super::` path in `src/**/*.rs` (comments, strings and test modules left out) and
//! fails on a path from a module to one at its own level or above, and on a cycle among the submodules of a
//! module. A new top-level module must be given a layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level modules by layer: a module may use only modules of a higher number.
const LAYERS: &[(&str, u32)] = &[
    ("abi", 0),
    ("hooks", 1),
    ("state", 2),
    ("memory", 3),
    ("throttle", 3),
    ("devices", 4),
    ("driver", 5),
    ("ffi", 6),
    ("locks", 7),
    ("log", 7),
    ("time", 7),
];

/// The same for `cuquota-core`: logging reads the configuration; the configuration and the region files both
/// produce a policy; parsing leaves at the bottom.
const CORE_LAYERS: &[(&str, u32)] = &[
    ("log", 0),
    ("config", 1),
    ("region", 1),
    ("policy", 2),
    ("units", 3),
    ("visible_devices", 3),
];

/// Source text without comments, string literals and test modules (an inline `#[cfg(test)] mod … { }` and
/// everything after it: test modules sit at the end of their file).
fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("#[cfg(test)]") {
            let rest = text[i + 12..].trim_start();
            let rest = rest
                .strip_prefix("pub(crate) ")
                .or(rest.strip_prefix("pub "))
                .unwrap_or(rest);
            // An inline test module (`mod tests { … }`); a `mod tests;` declaration is only a line.
            let inline = rest.find(['{', ';']).is_some_and(|j| rest.as_bytes()[j] == b'{');
            if rest.starts_with("mod ") && inline {
                break;
            }
        }
        match (b[i], b.get(i + 1)) {
            (b'/', Some(b'/')) => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            (b'/', Some(b'*')) => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                i = end;
            }
            (b'r', Some(b'#' | b'"'))
                if i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') =>
            {
                let hashes = text[i + 1..].bytes().take_while(|&c| c == b'#').count();
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                i = text[start..]
                    .find(&close)
                    .map_or(b.len(), |e| start + e + close.len());
                out.push_str("\"\"");
            }
            (b'"', _) => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            _ => {
                let ch = text[i..].chars().next().unwrap();
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    out
}

fn ident_at(s: &str) -> Option<&str> {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map_or(s.len(), |(i, _)| i);
    (end > 0).then(|| &s[..end])
}

/// The paths a `prefix::…` starting at `s` names (a `{a::b, c}` group gives several). Segments only.
fn paths_after(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut depth = 0;
        let mut item_start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths_after(&group[item_start..i], prefix.clone(), out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths_after(&group[item_start..i], prefix.clone(), out);
                    item_start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let Some(id) = ident_at(s) else {
        out.push(prefix);
        return;
    };
    let mut p = prefix;
    p.push(id.to_string());
    match s[id.len()..].trim_start().strip_prefix("::") {
        Some(rest) => paths_after(rest, p, out),
        None => out.push(p),
    }
}

/// Every absolute module path (segments after `crate`) the code of module `module` refers to.
fn references(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("::") {
        // the word just before `::`, if it is `crate` or a chain of `super`s
        let head_end = i;
        let head_start = code[..head_end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$'))
            .map_or(0, |p| p + 1);
        // `super::super::x` is read once, at its last `super`.
        if code[i + 2..].trim_start().starts_with("super::") {
            continue;
        }
        let head = &code[head_start..head_end];
        let base: Option<Vec<String>> = match head.trim_start_matches('$') {
            "crate" => Some(Vec::new()),
            h if h.split("::").all(|x| x == "super") => {
                let ups = h.split("::").count();
                (ups <= module.len()).then(|| module[..module.len() - ups].to_vec())
            }
            _ => None,
        };
        if let Some(base) = base {
            paths_after(&code[i + 2..], base, &mut out);
        }
    }
    out
}

/// Problems with the graph of `files` (module path → code).
fn check(files: &BTreeMap<Vec<String>, String>, layers: &[(&str, u32)]) -> Vec<String> {
    let layer: BTreeMap<&str, u32> = layers.iter().copied().collect();
    let modules: BTreeSet<&Vec<String>> = files.keys().collect();
    let mut problems = Vec::new();
    let mut edges: BTreeSet<(Vec<String>, Vec<String>)> = BTreeSet::new();
    for (m, text) in files {
        let Some(top) = m.first() else { continue };
        let Some(&from) = layer.get(top.as_str()) else {
            problems.push(format!("module `{top}` has no layer in tests/layers.rs"));
            continue;
        };
        for p in references(m, &code(text)) {
            let Some(target) = p.first() else { continue };
            if target != top {
                match layer.get(target.as_str()) {
                    Some(&to) if to > from => {}
                    Some(_) => problems.push(format!(
                        "{} uses crate::{}: an arrow up or sideways ({top} may use only layers below it)",
                        m.join("::"),
                        p.join("::")
                    )),
                    None => {} // an item of the crate root (a macro, say)
                }
                continue;
            }
            // The deepest module the path names.
            let to = (1..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|q| modules.contains(q))
                .unwrap_or_else(|| vec![top.clone()]);
            edges.insert((m.clone(), to));
        }
    }
    // Cycles among submodules: an edge between two modules neither of which contains the other, lifted to the
    // children of their common ancestor.
    let mut lifted: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (a, b) in &edges {
        let common = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
        if common == a.len() || common == b.len() {
            continue; // a module and its own submodule: one unit
        }
        lifted
            .entry(a[..=common].to_vec())
            .or_default()
            .insert(b[..=common].to_vec());
    }
    for start in lifted.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in lifted.get(&node).into_iter().flatten() {
                if next == start {
                    let names: Vec<String> = path.iter().chain([start]).map(|p| p.join("::")).collect();
                    problems.push(format!("cycle: {}", names.join(" → ")));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// `src/**/*.rs` as module path → text (files named `tests.rs` are test modules: left out).
fn read_src(root: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") || p.file_name().unwrap() == "tests.rs" {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
                segs.pop();
            }
            if segs.is_empty() {
                continue; // lib.rs declares the modules
            }
            out.insert(segs, std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

#[test]
fn the_shims_modules_point_one_way() {
    let files = read_src(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(files.len() > 20, "read only {} files", files.len());
    let problems = check(&files, LAYERS);
    assert!(problems.is_empty(), "module graph:\n{}", problems.join("\n"));
}

#[test]
fn the_cores_modules_point_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src");
    let files = read_src(&root);
    assert!(files.len() > 10, "read only {} files", files.len());
    let problems = check(&files, CORE_LAYERS);
    assert!(
        problems.is_empty(),
        "core's module graph:\n{}",
        problems.join("\n")
    );
}

fn tree(files: &[(&str, &str)]) -> BTreeMap<Vec<String>, String> {
    files
        .iter()
        .map(|(m, t)| (m.split("::").map(String::from).collect(), t.to_string()))
        .collect()
}

#[test]
fn the_check_finds_upward_and_sideways_arrows() {
    let t = tree(&[
        (
            "memory",
            "use crate::{devices::Dev, throttle::SmThrottle};\nfn f() { crate::abi::x(); }",
        ),
        (
            "devices",
            "// crate::hooks in a comment\nconst S: &str = \"crate::state\";\nuse crate::log;",
        ),
        ("throttle::engine", "use super::super::state::Shim;"),
        (
            "driver",
            "fn g() { $crate::ffi::X; }\n#[cfg(test)]\nmod tests { use crate::abi; }",
        ),
    ]);
    let p = check(&t, LAYERS);
    assert_eq!(p.len(), 3, "{p:#?}");
    assert!(p[0].starts_with("memory uses crate::abi::x"), "{p:#?}");
    assert!(
        p[1].starts_with("memory uses crate::throttle::SmThrottle"),
        "{p:#?}"
    );
    assert!(
        p[2].starts_with("throttle::engine uses crate::state::Shim"),
        "{p:#?}"
    );
    assert_eq!(
        check(&tree(&[("newmod", "")]), LAYERS),
        ["module `newmod` has no layer in tests/layers.rs"]
    );
}

#[test]
fn the_check_finds_a_cycle_among_submodules() {
    let t = tree(&[
        ("throttle", "pub mod a; pub mod b; use a::X;"),
        ("throttle::a", "use super::b::Y; use super::X;"),
        ("throttle::b", "use crate::throttle::a::Z;"),
    ]);
    assert_eq!(
        check(&t, LAYERS),
        [
            "cycle: throttle::a → throttle::b → throttle::a",
            "cycle: throttle::b → throttle::a → throttle::b"
        ]
    );
    let t = tree(&[("throttle::a", "use super::b::Y;"), ("throttle::b", "")]);
    assert!(check(&t, LAYERS).is_empty());
}
