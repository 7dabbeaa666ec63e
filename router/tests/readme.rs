//! The documentation cannot silently go stale:
//!
//! - the flag reference in `docs/configuration.md` is clap's own help text
//!   (regenerate with `SHOAL_UPDATE_README=1 cargo test -p shoal --test readme`);
//! - every flag the README and `docs/*.md` give `shoal` exists;
//! - every `docs/*.md` page is linked from the README, and every relative
//!   link in those pages reaches an existing file (and heading).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use shoal::cli::MeshCli;
use shoal::config::Config;

const START: &str = "<!-- flags:start -->\n```text\n";
const END: &str = "```\n<!-- flags:end -->";

/// The page that holds the generated flag reference, from the root.
const FLAG_PAGE: &str = "docs/configuration.md";

/// The repository root (this crate is `router/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `README.md` and every `docs/*.md`, as (path from the root, text), sorted.
fn pages() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), read(&root().join("README.md")))];
    out.extend(doc_pages().into_iter().map(|name| {
        (
            format!("docs/{name}"),
            read(&root().join("docs").join(&name)),
        )
    }));
    out
}

/// The file names of `docs/*.md`, sorted.
fn doc_pages() -> Vec<String> {
    let dir = root().join("docs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .collect();
    names.sort();
    names
}

fn rendered_help() -> String {
    let mut command = Config::command()
        .term_width(100)
        .mut_args(|arg| arg.hide_env_values(true));
    let help = command.render_long_help().to_string();
    // Trailing spaces are noise in Markdown.
    help.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn flag_reference_matches_clap_help() {
    let path = root().join(FLAG_PAGE);
    let page = read(&path);
    let start = page
        .find(START)
        .unwrap_or_else(|| panic!("{FLAG_PAGE} has the flags:start marker"))
        + START.len();
    let end = page
        .find(END)
        .unwrap_or_else(|| panic!("{FLAG_PAGE} has the flags:end marker"));
    let help = rendered_help();
    if std::env::var_os("SHOAL_UPDATE_README").is_some() {
        let updated = format!("{}{}{}", &page[..start], help, &page[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    assert_eq!(
        &page[start..end],
        help,
        "{FLAG_PAGE}'s flag reference is out of date: run \
         SHOAL_UPDATE_README=1 cargo test -p shoal --test readme"
    );
}

/// Flags of other programs that the pages mention on their own, in prose
/// (`--slots`), where nothing says which program they belong to. Each is
/// named with its program; a flag that is not here and not `shoal`'s fails
/// [`every_documented_flag_exists`].
const FOREIGN_FLAGS: &[(&str, &str)] = &[
    ("--max-num-seqs", "vLLM"),
    ("--lora-modules", "vLLM"),
    ("--enable-metrics", "SGLang"),
    ("--metrics", "llama.cpp"),
    ("--slots", "llama.cpp"),
    ("--replicas", "deploy/local/demo.sh"),
    ("--engines", "deploy/local/demo.sh"),
    ("--base-port", "deploy/local/demo.sh"),
    ("--quick-check", "deploy/local/demo.sh"),
    ("--help", "every program"),
];

/// The long flags (`--name`) of `command` itself.
fn long_flags(command: &clap::Command) -> BTreeSet<String> {
    command
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .map(|long| format!("--{long}"))
        .chain(["--help".to_string(), "--version".to_string()])
        .collect()
}

/// The `--name` tokens of `text` (a name: a lowercase letter, then
/// lowercase letters, digits and `-`) with their byte offsets; a glob such
/// as `--mesh-tls-*` is kept as `--mesh-tls-*` (any flag with that prefix).
fn flag_tokens(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(found) = text[i..].find("--") {
        let at = i + found;
        i = at + 2;
        let glued = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'-');
        if glued || !bytes.get(i).is_some_and(u8::is_ascii_lowercase) {
            continue;
        }
        let mut end = i;
        while bytes
            .get(end)
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        {
            end += 1;
        }
        let glob = bytes.get(end) == Some(&b'*');
        let name = text[at..end].trim_end_matches('-');
        out.push((
            at,
            if glob {
                format!("{name}*")
            } else {
                name.to_string()
            },
        ));
        i = end;
    }
    out
}

/// Whose flags a command's `--name` tokens are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    /// The server, `shoal [OPTIONS]`.
    Server,
    /// `shoal mesh SUBCOMMAND`.
    Mesh(String),
}

/// What one command (no `&&`, `|` or `;` in it) gives `shoal`: the owner
/// and the text holding its flags, or `None` for another program.
fn shoal_args(command: &str) -> Option<(Owner, String)> {
    let words: Vec<&str> = command
        .split_whitespace()
        .skip_while(|word| word.contains('=') && !word.starts_with('-')) // VAR=value
        .collect();
    let first = *words.first()?;
    let name = first.rsplit('/').next().unwrap_or(first);
    if name == "shoal" {
        if words.get(1) == Some(&"mesh") {
            let sub = words.get(2).copied().unwrap_or_default().to_string();
            return Some((
                Owner::Mesh(sub),
                words.get(3..).unwrap_or_default().join(" "),
            ));
        }
        return Some((Owner::Server, words[1..].join(" ")));
    }
    let runs_shoal = words.get(1) == Some(&"run") && words.windows(2).any(|w| w == ["-p", "shoal"]);
    if name == "cargo" && runs_shoal {
        let dashes = words.iter().position(|word| *word == "--")?;
        return Some((Owner::Server, words[dashes + 1..].join(" ")));
    }
    None
}

/// A documented flag: the flag, whose it is said to be, and where.
type Documented = (String, Owner, String);

/// The flags a command (a code-block line or an inline code span) gives
/// `shoal`, added to `out`.
fn command_flags(command: &str, place: &str, foreign: &BTreeSet<&str>, out: &mut Vec<Documented>) {
    for part in command.split(['|', ';', '&']) {
        let part = part.split(" #").next().unwrap_or(part).trim(); // a comment
        if part.starts_with("--") {
            // A flag on its own, `--policy least_load`: taken as shoal's.
            prose_flags(part, &|_| place.to_string(), foreign, out);
        } else if let Some((owner, args)) = shoal_args(part) {
            for (_, flag) in flag_tokens(&args) {
                out.push((flag, owner.clone(), place.to_string()));
            }
        }
    }
}

/// The flags of text that names no program, taken as shoal's unless
/// [`FOREIGN_FLAGS`] names them, added to `out`; `place` says where the
/// flag at a byte offset of `text` is.
fn prose_flags(
    text: &str,
    place: &dyn Fn(usize) -> String,
    foreign: &BTreeSet<&str>,
    out: &mut Vec<Documented>,
) {
    for (offset, flag) in flag_tokens(text) {
        if !foreign.contains(flag.as_str()) {
            out.push((flag, Owner::Server, place(offset)));
        }
    }
}

/// The flags the pages give `shoal`.
///
/// Markdown does not say which program a `--flag` belongs to, and the
/// pages also show cargo's, curl's, kubectl's, docker's, the engines' and
/// the scripts' own flags, so the pages are read as follows (the generated
/// reference between the flags markers is skipped: it is clap's own help,
/// checked by [`flag_reference_matches_clap_help`]):
///
/// - a command (a line of a fenced code block, with its `\` continuations,
///   or an inline code span, which may wrap; split at `&&`, `|` and `;`;
///   a ` #` comment dropped) is checked by the program it runs: `shoal`
///   (by any path) against the server's flags, `shoal mesh SUB` against
///   that subcommand's, `cargo run ... -p shoal -- ...` against the
///   server's for what follows `--`, and any other program not at all;
/// - every other `--flag` — one that opens an inline code span
///   (`` `--policy least_load` ``) or stands in prose — is taken as
///   shoal's unless [`FOREIGN_FLAGS`] names it with its program.
///
/// So an example of another program goes in a code span or block line
/// that starts with the program's name, and a foreign flag mentioned on
/// its own goes in [`FOREIGN_FLAGS`].
fn documented_flags() -> Vec<Documented> {
    let foreign: BTreeSet<&str> = FOREIGN_FLAGS.iter().map(|(flag, _)| *flag).collect();
    let mut out = Vec::new();
    for (page, text) in pages() {
        let lines: Vec<&str> = text.lines().collect();
        // Prose (outside code blocks) with each line's start offset.
        let mut prose = String::new();
        let mut starts: Vec<(usize, usize)> = Vec::new();
        let mut n = 0;
        while n < lines.len() {
            if lines[n].starts_with("<!-- flags:start -->") {
                while n < lines.len() && !lines[n].starts_with("<!-- flags:end -->") {
                    n += 1;
                }
            } else if lines[n].trim_start().starts_with("```") {
                n += 1;
                while n < lines.len() && !lines[n].trim_start().starts_with("```") {
                    let place = format!("{page}:{}", n + 1);
                    let mut command = lines[n].trim_end().to_string();
                    while command.ends_with('\\') && n + 1 < lines.len() {
                        command.pop();
                        n += 1;
                        command.push(' ');
                        command.push_str(lines[n].trim());
                    }
                    command_flags(&command, &place, &foreign, &mut out);
                    n += 1;
                }
            } else {
                starts.push((prose.len(), n + 1));
                prose.push_str(lines[n]);
                prose.push('\n');
            }
            n += 1;
        }
        let place = |offset: usize| {
            let i = starts.partition_point(|(start, _)| *start <= offset);
            format!("{page}:{}", starts[i.saturating_sub(1)].1)
        };
        // Inline code spans are commands; the text between them is prose.
        let mut rest = 0;
        while let Some(open) = prose[rest..].find('`').map(|i| rest + i) {
            prose_flags(
                &prose[rest..open],
                &|at| place(rest + at),
                &foreign,
                &mut out,
            );
            let ticks = prose[open..].len() - prose[open..].trim_start_matches('`').len();
            let inner = open + ticks;
            let Some(close) = prose[inner..].find(&"`".repeat(ticks)).map(|i| inner + i) else {
                rest = open;
                break;
            };
            let span = prose[inner..close].replace('\n', " ");
            command_flags(&span, &place(open), &foreign, &mut out);
            rest = close + ticks;
        }
        prose_flags(&prose[rest..], &|at| place(rest + at), &foreign, &mut out);
    }
    out
}

#[test]
fn every_documented_flag_exists() {
    let server = long_flags(&Config::command());
    let mesh: BTreeMap<String, BTreeSet<String>> = MeshCli::command()
        .get_subcommands()
        .map(|sub| (sub.get_name().to_string(), long_flags(sub)))
        .collect();
    let documented = documented_flags();
    for expected in ["--policy", "--worker-urls", "--nodes"] {
        assert!(
            documented.iter().any(|(flag, ..)| flag == expected),
            "the scan misses {expected}, which the docs use: it reads too little"
        );
    }
    let mut unknown = Vec::new();
    for (flag, owner, place) in &documented {
        let (known, whose) = match owner {
            Owner::Server => (Some(&server), "shoal".to_string()),
            Owner::Mesh(sub) => (mesh.get(sub), format!("shoal mesh {sub}")),
        };
        let known = known.cloned().unwrap_or_default();
        let exists = match flag.strip_suffix('*') {
            Some(prefix) => known.iter().any(|name| name.starts_with(prefix)),
            None => known.contains(flag),
        };
        if !exists {
            unknown.push(format!("{flag} (as {whose}'s, {place})"));
        }
    }
    assert!(
        unknown.is_empty(),
        "the docs name flags that shoal does not define (rename them; for another \
         program's flag, start its code span with the program's name, or add it to \
         FOREIGN_FLAGS):\n  {}",
        unknown.join("\n  ")
    );
}

/// GitHub's anchor for a heading: lowercase; letters, digits, `-` and `_`
/// kept, spaces turned into `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a page's inline links, `[text](target)`, outside code
/// blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Every `](...)` is a link: no code span in these pages holds one.
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(close) = after.find(')') else { break };
            out.push(after[..close].to_string());
            rest = &after[close..];
        }
    }
    out
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = read(&root().join("README.md"));
    let linked: BTreeSet<String> = link_targets(&readme)
        .into_iter()
        .map(|target| target.split('#').next().unwrap_or_default().to_string())
        .collect();
    let missing: Vec<String> = doc_pages()
        .into_iter()
        .map(|name| format!("docs/{name}"))
        .filter(|page| !linked.contains(page))
        .collect();
    assert!(
        !doc_pages().is_empty(),
        "docs/ holds no page: the test reads the wrong directory"
    );
    assert!(
        missing.is_empty(),
        "README.md's Documentation list does not link these pages: {missing:?}"
    );
    for page in ["ARCHITECTURE.md", "tests/BENCHMARKS.md"] {
        assert!(linked.contains(page), "README.md does not link {page}");
    }
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (page, text) in pages() {
        let dir = Path::new(&page)
            .parent()
            .unwrap_or(Path::new(""))
            .to_path_buf();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                root().join(&page)
            } else {
                root().join(&dir).join(file)
            };
            if !path.exists() {
                broken.push(format!("{page}: {target} (no file {file})"));
                continue;
            }
            let is_markdown = path.extension().is_some_and(|ext| ext == "md");
            if !fragment.is_empty() && is_markdown && !anchors(&read(&path)).contains(fragment) {
                broken.push(format!("{page}: {target} (no heading #{fragment})"));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} relative links found: the scan reads too little"
    );
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}
