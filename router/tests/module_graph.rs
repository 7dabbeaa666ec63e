//! The `router` crate's top-level modules form no dependency cycle: each
//! module's non-test code may name (`crate::x`) only modules below it.
//! Read from the source text, so it needs no extra tool in CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The non-test part of a source file: test-only files are skipped, and a
/// file's text stops at its `#[cfg(test)]` module.
fn production_text(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if matches!(name, "tests.rs" | "testkit.rs" | "invariance.rs") || name.ends_with("_tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let cut = text.find("#[cfg(test)]").unwrap_or(text.len());
    Some(text[..cut].to_string())
}

/// Top-level module of a file under `src` (`lib.rs`, `main.rs`: none).
fn module_of(src: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let module = first.trim_end_matches(".rs");
    (module != "lib" && module != "main").then(|| module.to_string())
}

/// Every `crate::name` the text mentions, including inside `use crate::{a, b}`.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let (Some(from), Some(text)) = (module_of(&src, file), production_text(file)) else {
            continue;
        };
        let deps = edges.entry(from.clone()).or_default();
        for to in referenced(&text) {
            if to != from && modules.contains(&to) {
                deps.insert(to);
            }
        }
    }
    edges
}

/// Every cycle through `start`, as the path that closes it.
fn cycle_from(
    edges: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    at: &str,
    path: &mut Vec<String>,
    found: &mut BTreeSet<Vec<String>>,
) {
    for next in edges.get(at).into_iter().flatten() {
        if next == start {
            let mut cycle = path.clone();
            cycle.push(start.to_string());
            found.insert(cycle);
        } else if !path.contains(next) && next.as_str() > start {
            path.push(next.clone());
            cycle_from(edges, start, next, path, found);
            path.pop();
        }
    }
}

#[test]
fn router_modules_form_no_cycle() {
    let edges = graph();
    let mut cycles = BTreeSet::new();
    for start in edges.keys() {
        cycle_from(&edges, start, start, &mut vec![start.clone()], &mut cycles);
    }
    let shown: Vec<String> = cycles.iter().map(|c| c.join(" -> ")).collect();
    assert!(
        shown.is_empty(),
        "module cycles in router/src:\n  {}",
        shown.join("\n  ")
    );
}

#[test]
fn the_reader_finds_grouped_and_inline_paths() {
    let names = referenced("use crate::{a::X, b}; fn f() { crate::c::g(); }");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
}
