//! The docs name only what exists. Every Markdown document of the repository (README.md, DESIGN.md, docs/,
//! the crates' READMEs) is read and each of these must resolve, or the test fails naming the document, the line
//! and the reference:
//! - a relative link `[text](path#anchor)`: the path exists, relative to the document;
//! - a code span naming a repository path (`src/hooks/memory.rs`, `shim-tests/tests/`): it exists from the root;
//! - a code span naming a source file alone (`ipc_shared.rs`): some file of that name exists;
//! - a code span that is a long snake_case name (three underscores or more: test and function names such as
//!   `a_dead_importer_lets_go`) or ends a `Type::function` path: the word occurs in the code of some source file
//!   (comments do not count: a name that only a comment still mentions is gone).
//!
//! Placeholders (`<…>`, `…`, `*`, `{a,b}`) are not references.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Top-level folders whose paths a document may name.
const TOP: &[&str] = &[
    "src/",
    "agent/",
    "ffi/",
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
    "deploy/",
    ".ci/",
];

/// Names of other projects' code that the documents discuss.
const EXTERNAL: &[&str] = &["get_limit_from_env", "shrreg_proc_slot_t"];

/// Other projects' paths that comments cite (HAMi-core's sources).
const EXTERNAL_PATHS: &[&str] = &["src/multiprocess/"];

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

/// The number of `#` of a Rust raw string whose opening quote is at `at` (`r"`, `r#"`, `br##"`), if it is one.
fn raw_hashes(b: &[u8], at: usize) -> Option<usize> {
    let hashes = b[..at].iter().rev().take_while(|&&c| c == b'#').count();
    let r = at.checked_sub(hashes + 1)?;
    let word_before = r > 0 && (b[r - 1].is_ascii_alphanumeric() || b[r - 1] == b'_') && b[r - 1] != b'b';
    (b[r] == b'r' && !word_before).then_some(hashes)
}

/// `text` with its comments blanked out, so that only code (string literals included) is left: `//` and
/// `/* */` for the C-like languages, `#` for the others; JSON and text have none.
fn code_of(ext: &str, text: &str) -> String {
    split_comments(ext, text).0
}

/// `text` as (its code with the comments blanked out, its comments).
fn split_comments(ext: &str, text: &str) -> (String, String) {
    let c_like = matches!(ext, "rs" | "c" | "h" | "cu");
    let hash = matches!(ext, "py" | "sh" | "toml" | "yaml");
    if !c_like && !hash {
        return (text.to_owned(), String::new());
    }
    let b = text.as_bytes();
    let (mut out, mut comments) = (String::with_capacity(text.len()), String::new());
    let (mut i, mut from) = (0, 0);
    // Pushes the code before `at`, then the comment from `at` to `to`.
    let mut cut = |out: &mut String, at: usize, to: usize, from: &mut usize| {
        out.push_str(&text[*from..at]);
        out.push(' ');
        comments.push_str(&text[at..to]);
        comments.push('\n');
        *from = to;
    };
    while i < b.len() {
        match b[i] {
            b'"' if c_like && raw_hashes(b, i).is_some() => {
                // A Rust raw string: to `"` and as many `#` as opened it, no escapes.
                let close = format!("\"{}", "#".repeat(raw_hashes(b, i).unwrap_or(0)));
                i = text[i + 1..]
                    .find(&close)
                    .map_or(b.len(), |n| i + 1 + n + close.len());
            }
            b'"' | b'\'' if hash || b[i] == b'"' => {
                // A string: to its closing quote (escapes skipped); a shell's or Python's ends with its line.
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q && !(hash && b[i] == b'\n') {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'\'' => {
                // A character literal ('x', '\n', '"'); a lifetime has no closing quote.
                let end = if b.get(i + 1) == Some(&b'\\') {
                    i + 3
                } else {
                    i + 2
                };
                i = if b.get(end) == Some(&b'\'') {
                    end + 1
                } else {
                    i + 1
                };
            }
            b'/' if c_like && b.get(i + 1) == Some(&b'/') => {
                let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
                cut(&mut out, i, end, &mut from);
                i = end;
            }
            b'/' if c_like && b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
                cut(&mut out, i, end, &mut from);
                i = end;
            }
            b'#' if hash && (i == 0 || b[i - 1].is_ascii_whitespace()) => {
                let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
                cut(&mut out, i, end, &mut from);
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[from.min(text.len())..]);
    (out, comments)
}

/// What the documents may refer to: every file name, and every word of the source files' code.
struct Repo {
    root: PathBuf,
    file_names: HashSet<String>,
    words: HashSet<String>,
    /// Each source file with its comments.
    comments: Vec<(PathBuf, String)>,
}

impl Repo {
    fn scan(root: &Path) -> (Repo, Vec<PathBuf>) {
        let mut files = Vec::new();
        walk(root, &mut files);
        let mut file_names = HashSet::new();
        let mut words = HashSet::new();
        let mut comments = Vec::new();
        let mut docs = Vec::new();
        for f in &files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            let ext = f.extension().map(|e| e.to_string_lossy().into_owned());
            if ext.as_deref() == Some("md") {
                docs.push(f.clone());
            }
            // This file's own examples of dangling names must not make them resolve.
            let own = f.ends_with(file!());
            if let Some(e) = ext.as_deref().filter(|e| !own && SOURCE_EXT.contains(e)) {
                if let Ok(text) = std::fs::read_to_string(f) {
                    let (code, comment) = split_comments(e, &text);
                    comments.push((f.clone(), comment));
                    words.extend(
                        code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
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
                comments,
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

impl Repo {
    /// Every repository path a source file's comments name that is not there, as `file: path`. A path counts
    /// from the root or from any folder above the file (a crate's own `src/…`); placeholders (`NAME.c`) and
    /// other projects' paths are not references.
    fn dangling_comment_paths(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (file, comments) in &self.comments {
            let rel = file.strip_prefix(&self.root).unwrap_or(file);
            if rel.starts_with("core/tests/fixtures") {
                continue; // files as an earlier release wrote them
            }
            let tokens = comments.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)));
            for token in tokens {
                let path = token.trim_end_matches(['.', '/']);
                let named = TOP.iter().any(|t| path.starts_with(t))
                    && path.rsplit('/').next().is_some_and(|last| {
                        last.contains('.') && !last.starts_with(|c: char| c.is_ascii_uppercase())
                    });
                if !named || EXTERNAL_PATHS.iter().any(|e| path.starts_with(e)) {
                    continue;
                }
                let found = file
                    .ancestors()
                    .skip(1)
                    .take_while(|d| d.starts_with(&self.root))
                    .any(|d| d.join(path).exists());
                if !found {
                    bad.push(format!("{}: {path}", rel.display()));
                }
            }
        }
        bad.sort();
        bad.dedup();
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
                `review_pass33_prequeued_work_outlives_a_live_limit` `agent/src/gone.rs` `ffi/src/cuda.rs`\n\
                ```\n`src/inside/a/fence.rs`\n```\n\
                `src/<module>.rs` `CUDA_DEVICE_MEMORY_LIMIT_<i>` `cuMemAlloc_v2` `yes >/dev/null`\n";
    let bad = repo.check_doc(&doc, text);
    let expect = [
        "docs/example.md:1: link to a missing `../docs/gone.md`",
        "docs/example.md:2: no file or folder `src/hooks/vanished.rs`",
        "docs/example.md:2: no file named `nowhere_test.rs`",
        "docs/example.md:3: no source names `a_test_that_was_never_written`",
        "docs/example.md:3: no source names `admit_forever`",
        // Named only in a comment (shim-tests/tests/live_limits_every_entry_point.rs): the test is not here.
        "docs/example.md:4: no source names `review_pass33_prequeued_work_outlives_a_live_limit`",
        "docs/example.md:4: no file or folder `agent/src/gone.rs`",
    ];
    assert_eq!(bad, expect);
}

#[test]
fn names_in_comments_are_not_code() {
    let rust = "fn kept_in_code() {} // only_in_a_line_comment\n/* only_in_a_block_comment */\n\
                /// only_in_a_doc_comment\nlet s = \"in_a_string // not_a_comment\"; let c = '\"'; after_a_char();\n\
                let r = r#\"raw \"quoted\" // in_a_raw_string\"#; fn f<'a>(x: &'a u8) {} after_a_lifetime();";
    let code = code_of("rs", rust);
    for kept in [
        "kept_in_code",
        "in_a_string",
        "not_a_comment",
        "after_a_char",
        "in_a_raw_string",
        "after_a_lifetime",
    ] {
        assert!(code.contains(kept), "{kept} lost from {code:?}");
    }
    for gone in [
        "only_in_a_line_comment",
        "only_in_a_block_comment",
        "only_in_a_doc_comment",
    ] {
        assert!(!code.contains(gone), "{gone} kept in {code:?}");
    }
    let sh = "run_this --flag # only_in_a_shell_comment\necho \"a # in_quotes\" ${#x} after_it\n";
    let code = code_of("sh", sh);
    assert!(
        code.contains("run_this") && code.contains("in_quotes") && code.contains("after_it"),
        "{code:?}"
    );
    assert!(!code.contains("only_in_a_shell_comment"), "{code:?}");
}

#[test]
fn every_source_comment_names_only_paths_that_exist() {
    let (repo, _) = Repo::scan(&root());
    let bad = repo.dangling_comment_paths();
    assert!(
        bad.is_empty(),
        "comments name paths that do not exist:\n{}",
        bad.join("\n")
    );
}
