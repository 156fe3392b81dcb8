//! The docs name only what exists. Every Markdown document of the repository (README.md, DESIGN.md, docs/,
//! the crates' READMEs) is read and each of these must resolve, or the test fails naming the document, the line
//! and the reference:
//! - a relative link `[text](path#anchor)`: the path exists, relative to the document;
//! - a code span naming a repository path (`src/hooks/memory.rs`, `shim-tests/tests/`): it exists from the root;
//! - a code span naming a source file alone (`ipc_shared.rs`): some file of that name exists;
//! - a code span that is a long snake_case name (three underscores or more: test and function names such as
//!   `a_dead_importer_lets_go`) or ends a `Type::function` path: the word occurs in some source file.
//!
//! Placeholders (`<…>`, `…`, `*`, `{a,b}`) are not references.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Top-level folders whose paths a document may name.
const TOP: &[&str] = &[
    "src/",
    "core/",
    "cli/",
    "shim-tests/",
    "docs/",
    "examples/",
    "scripts/",
    "bench/",
    "bench-throttle/",
    "dra/",
    "include/",
    "tests/",
    ".ci/",
];

/// Names of other projects' code that the documents discuss.
const EXTERNAL: &[&str] = &["get_limit_from_env"];

const SOURCE_EXT: &[&str] = &["rs", "c", "h", "cu", "py", "sh", "toml", "yaml", "json", "txt"];

fn skip_dir(name: &str) -> bool {
    matches!(
        name,
        "target" | ".git" | ".deps" | "node_modules" | "dist" | "__pycache__"
    )
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !skip_dir(&name) {
                walk(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}

/// What the documents may refer to: every file name, and every word of the source files.
struct Repo {
    root: PathBuf,
    file_names: HashSet<String>,
    words: HashSet<String>,
}

impl Repo {
    fn scan(root: &Path) -> (Repo, Vec<PathBuf>) {
        let mut files = Vec::new();
        walk(root, &mut files);
        let mut file_names = HashSet::new();
        let mut words = HashSet::new();
        let mut docs = Vec::new();
        for f in &files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            let ext = f.extension().map(|e| e.to_string_lossy().into_owned());
            if ext.as_deref() == Some("md") {
                docs.push(f.clone());
            }
            // This file's own examples of dangling names must not make them resolve.
            let own = f.ends_with(file!());
            if !own && ext.as_deref().is_some_and(|e| SOURCE_EXT.contains(&e)) {
                if let Ok(text) = std::fs::read_to_string(f) {
                    words.extend(
                        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .filter(|w| w.contains('_'))
                            .map(str::to_owned),
                    );
                }
            }
            file_names.insert(name);
        }
        docs.sort();
        (
            Repo {
                root: root.to_path_buf(),
                file_names,
                words,
            },
            docs,
        )
    }

    /// Why `span`, a code span of a document, names nothing that exists (`None`: it resolves or is no reference).
    fn check_span(&self, dir: &Path, span: &str) -> Option<String> {
        let span = span.trim();
        if span.contains(['<', '…', '*', '{', ' ', '$', '=']) || span.starts_with("...") {
            return None;
        }
        let path = span.split(['#', ':']).next().unwrap_or(span);
        if TOP.iter().any(|t| path.starts_with(t)) {
            // From the root, or from the folder of a crate's own README.
            let found = dir
                .ancestors()
                .take_while(|d| d.starts_with(&self.root))
                .any(|d| d.join(path).exists());
            return (!found).then(|| format!("no file or folder `{path}`"));
        }
        if !path.contains('/') {
            if let Some((_, ext)) = path.rsplit_once('.') {
                if ["rs", "c", "cu", "sh", "py"].contains(&ext) && path.len() > ext.len() + 1 {
                    return (!self.file_names.contains(path)).then(|| format!("no file named `{path}`"));
                }
            }
        }
        let ident = |w: &str| {
            !w.is_empty()
                && w.starts_with(|c: char| c.is_ascii_lowercase())
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        let last = span.rsplit("::").next().unwrap_or(span);
        let last = last.strip_suffix("()").unwrap_or(last);
        let named = if span.contains("::") {
            ident(last) && last.contains('_')
        } else {
            ident(last) && last.matches('_').count() >= 3
        };
        (named && !self.words.contains(last) && !EXTERNAL.contains(&last))
            .then(|| format!("no source names `{last}`"))
    }

    /// Every dangling reference of one document, as `doc:line: why`.
    fn check_doc(&self, doc: &Path, text: &str) -> Vec<String> {
        let rel = doc.strip_prefix(&self.root).unwrap_or(doc).display().to_string();
        let dir = doc.parent().unwrap();
        let mut bad = Vec::new();
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            let mut report = |why: String| bad.push(format!("{rel}:{}: {why}", n + 1));
            for (i, part) in line.split('`').enumerate() {
                if i % 2 == 1 {
                    if let Some(why) = self.check_span(dir, part) {
                        report(why);
                    }
                }
            }
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                let path = target.split('#').next().unwrap_or("");
                let external = target.contains("://") || target.starts_with("mailto:");
                if !external && !path.is_empty() && !dir.join(path).exists() {
                    report(format!("link to a missing `{path}`"));
                }
            }
        }
        bad
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_document_names_only_what_exists() {
    let (repo, docs) = Repo::scan(&root());
    assert!(docs.len() >= 10, "found only {} Markdown documents", docs.len());
    let mut bad = Vec::new();
    for d in &docs {
        let text = std::fs::read_to_string(d).unwrap();
        bad.extend(repo.check_doc(d, &text));
    }
    assert!(
        bad.is_empty(),
        "documents name what does not exist:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_catches_each_kind_of_dangling_reference() {
    let (repo, _) = Repo::scan(&root());
    let doc = root().join("docs/example.md");
    let text = "see [the design](../DESIGN.md) and [gone](../docs/gone.md#x)\n\
                `src/hooks/memory.rs`, `src/hooks/vanished.rs`, `ipc_shared.rs`, `nowhere_test.rs`\n\
                `a_dead_importer_lets_go` `a_test_that_was_never_written` `Memory::admit` `Memory::admit_forever`\n\
                ```\n`src/inside/a/fence.rs`\n```\n\
                `src/<module>.rs` `CUDA_DEVICE_MEMORY_LIMIT_<i>` `cuMemAlloc_v2` `yes >/dev/null`\n";
    let bad = repo.check_doc(&doc, text);
    let expect = [
        "docs/example.md:1: link to a missing `../docs/gone.md`",
        "docs/example.md:2: no file or folder `src/hooks/vanished.rs`",
        "docs/example.md:2: no file named `nowhere_test.rs`",
        "docs/example.md:3: no source names `a_test_that_was_never_written`",
        "docs/example.md:3: no source names `admit_forever`",
    ];
    assert_eq!(bad, expect);
}
