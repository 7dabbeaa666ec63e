//! Operator subcommands beside the server: `shoal mesh gen-certs` and
//! `shoal mesh status`. They share nothing with the server's flags, so they
//! have their own small parser and `main` dispatches on the first word.

mod gen_certs;
mod status;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use gen_certs::{GeneratedFiles, generate};
pub use status::render_table;

/// `shoal mesh ...`
#[derive(Debug, Parser)]
#[command(name = "shoal mesh", about = "Mesh tools: certificates and status")]
pub struct MeshCli {
    #[command(subcommand)]
    command: MeshCommand,
}

#[derive(Debug, Subcommand)]
enum MeshCommand {
    /// Write a cluster CA and one certificate + key per node (no openssl needed).
    GenCerts {
        /// Directory to write ca.pem, ca-key.pem, NODE.pem, NODE-key.pem into.
        #[arg(long)]
        out: PathBuf,
        /// Node names (DNS names, as given to --mesh-name); comma separated.
        #[arg(long, value_delimiter = ',', num_args = 1.., required = true)]
        nodes: Vec<String>,
        /// Years the certificates stay valid.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
        valid_years: u32,
        /// Overwrite files that already exist.
        #[arg(long)]
        force: bool,
    },
    /// Print a replica's /mesh/status as a table.
    Status {
        /// Base URL of the replica, e.g. http://127.0.0.1:30000.
        #[arg(long)]
        url: String,
        /// Print the raw JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// The replica's --admin-api-key, when it has one.
        #[arg(long, env = "SHOAL_ADMIN_API_KEY", hide_env_values = true)]
        admin_api_key: Option<crate::auth::Secret>,
    },
}

/// True when the arguments ask for a subcommand rather than the server.
pub fn is_subcommand(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|first| first == "mesh")
}

/// Runs `shoal mesh ...`; `args` starts with the program name.
pub async fn run(args: Vec<OsString>) -> ExitCode {
    let argv = std::iter::once(OsString::from("shoal mesh")).chain(args.into_iter().skip(2));
    let cli = match MeshCli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        MeshCommand::GenCerts {
            out,
            nodes,
            valid_years,
            force,
        } => match generate(&out, &nodes, valid_years, force) {
            Ok(files) => {
                println!("wrote {} files to {}:", files.paths.len(), out.display());
                for path in &files.paths {
                    println!("  {}", path.display());
                }
                println!(
                    "start each replica with --mesh-name NODE --mesh-tls-ca {0}/ca.pem \
                     --mesh-tls-cert {0}/NODE.pem --mesh-tls-key {0}/NODE-key.pem",
                    out.display()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(1)
            }
        },
        MeshCommand::Status {
            url,
            json,
            admin_api_key,
        } => match status::fetch(&url, admin_api_key.as_ref()).await {
            Ok(value) if json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).unwrap_or_default()
                );
                ExitCode::SUCCESS
            }
            Ok(value) => {
                print!("{}", render_table(&value));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(1)
            }
        },
    }
}
