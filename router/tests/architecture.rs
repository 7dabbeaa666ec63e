#![allow(clippy::unwrap_used, clippy::expect_used)]
//! ARCHITECTURE.md is the map of the code, and a map that silently misses
//! a part misleads more than none: this fails when a test file or a
//! top-level module exists that the map does not name, so adding one
//! means saying where it fits.
//!
//! What counts as named:
//!
//! - a test file (a `*.rs` file directly in `tests/tests/`,
//!   `router/tests/` or `mesh/tests/`; their support directories are not
//!   checked) by its file name, e.g. `body_limits.rs`: on its own, not as
//!   the tail of a longer name (`mesh_objects.rs`) or of another
//!   directory's path (`http/objects.rs`), though its own directory may
//!   come before it (`router/tests/objects.rs`);
//! - a top-level module of `router` or `mesh` (each `X.rs` file and `X/`
//!   directory directly in `router/src/` or `mesh/src/`, crate roots
//!   included) by its path from the repository root as the tree has it:
//!   `router/src/auth.rs` for a file, `router/src/proxy/` for a directory;
//!   a module that is both (`router/src/admission.rs` with
//!   `router/src/admission/`) may be named either way;
//! - a flag group by its `--help` heading, as a row of the Configuration
//!   table (``| `Mesh` |``).
//!
//! Read from the file tree, the flags and the document's text, so it needs no tool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Directories whose top-level `*.rs` files are test files, from the root.
const TEST_DIRS: [&str; 3] = ["tests/tests/", "router/tests/", "mesh/tests/"];

/// Directories whose entries are top-level modules, from the root.
const SOURCE_DIRS: [&str; 2] = ["router/src/", "mesh/src/"];

/// The repository root (this crate is `router/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn architecture() -> String {
    let path = root().join("ARCHITECTURE.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The entries directly in `dir` (from the root): name, and whether it is
/// a directory; sorted by name.
fn entries(dir: &str) -> Vec<(String, bool)> {
    let path = root().join(dir);
    let mut out: Vec<(String, bool)> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", path.display()))
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, entry.path().is_dir())
        })
        .collect();
    out.sort();
    out
}

/// Whether `doc` names `file` on its own (see the module doc), `dir`
/// being the directory it is in (ending in `/`).
fn names_file(doc: &str, file: &str, dir: &str) -> bool {
    let part_of_name = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    doc.match_indices(file).any(|(at, _)| {
        let before = &doc[..at];
        let starts = before.ends_with(dir)
            || before
                .chars()
                .next_back()
                .is_none_or(|c| !part_of_name(c) && c != '/');
        let ends = doc[at + file.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        starts && ends
    })
}

/// Each top-level module of `dir` (from the root), with the paths that
/// name it: `dir/X.rs` for a file, `dir/X/` for a directory.
fn modules(dir: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, is_dir) in entries(dir) {
        let (module, path) = match (is_dir, name.strip_suffix(".rs")) {
            (true, _) => (name.clone(), format!("{dir}{name}/")),
            (false, Some(stem)) => (stem.to_string(), format!("{dir}{name}")),
            (false, None) => continue,
        };
        out.entry(module).or_default().push(path);
    }
    out
}

#[test]
fn every_test_file_is_named() {
    let doc = architecture();
    let mut missing = Vec::new();
    for dir in TEST_DIRS {
        for (name, is_dir) in entries(dir) {
            if !is_dir && name.ends_with(".rs") && !names_file(&doc, &name, dir) {
                missing.push(format!("{dir}{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these test files (add each to its table in \
         \"Tests, by layer\" with one line on what it proves):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_flag_group_is_named() {
    use clap::CommandFactory;
    let doc = architecture();
    let command = shoal::config::Config::command();
    let headings: BTreeSet<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_help_heading())
        .collect();
    assert!(
        headings.len() > 10,
        "the flags come in groups: {headings:?}"
    );
    let missing: Vec<&str> = headings
        .into_iter()
        .filter(|heading| !doc.contains(&format!("| `{heading}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's flag-group table (\"Configuration\") has no row for these \
         --help headings (name the struct, its file and what reads it):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_top_level_module_is_named() {
    let doc = architecture();
    let mut missing = Vec::new();
    for dir in SOURCE_DIRS {
        for paths in modules(dir).into_values() {
            if !paths.iter().any(|path| doc.contains(path.as_str())) {
                missing.push(paths.join(" or "));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these modules by their path (add each to \
         \"Source map\" with one line on what it is):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn a_file_is_named_on_its_own_or_under_its_own_directory() {
    let dir = "router/tests/";
    assert!(names_file("objects.rs", "objects.rs", dir));
    assert!(names_file("see `objects.rs`.", "objects.rs", dir));
    assert!(names_file("(router/tests/objects.rs)", "objects.rs", dir));
    assert!(!names_file("`http/objects.rs`", "objects.rs", dir));
    assert!(!names_file("`mesh/tests/objects.rs`", "objects.rs", dir));
    assert!(!names_file("`mesh_objects.rs`", "objects.rs", dir));
    assert!(!names_file("`objects.rs_old`", "objects.rs", dir));
}

#[test]
fn a_module_that_is_a_file_and_a_directory_has_both_paths() {
    let admission = modules("router/src/").remove("admission").unwrap();
    assert_eq!(
        admission,
        ["router/src/admission/", "router/src/admission.rs"]
    );
}
