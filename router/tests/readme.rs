//! The README's flag reference is clap's own help text, so the two cannot
//! drift. Regenerate with `SHOAL_UPDATE_README=1 cargo test -p shoal --test readme`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::CommandFactory;
use shoal::config::Config;

const START: &str = "<!-- flags:start -->\n```text\n";
const END: &str = "```\n<!-- flags:end -->";

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
fn readme_flag_reference_matches_clap_help() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let start = readme
        .find(START)
        .expect("README has the flags:start marker")
        + START.len();
    let end = readme.find(END).expect("README has the flags:end marker");
    let help = rendered_help();
    if std::env::var_os("SHOAL_UPDATE_README").is_some() {
        let updated = format!("{}{}{}", &readme[..start], help, &readme[end..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..end],
        help,
        "README flag reference is out of date: run SHOAL_UPDATE_README=1 cargo test -p shoal --test readme"
    );
}
