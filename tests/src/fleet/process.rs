//! Child processes: finding the `shoal` binary, free loopback ports,
//! generating certificates and starting one replica up to its
//! `shoal listening on http://ADDR` line.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::FleetError;

/// Environment variable that overrides where the `shoal` binary is.
pub const SHOAL_BIN_ENV: &str = "SHOAL_BIN";

/// Finds the `shoal` binary: `explicit` if given, else `$SHOAL_BIN`, else
/// next to the running executable in the same target directory (a binary
/// in `target/<profile>/` or a test in `target/<profile>/deps/`).
pub fn locate_shoal(explicit: Option<&Path>) -> Result<PathBuf, FleetError> {
    if let Some(path) = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(SHOAL_BIN_ENV).map(PathBuf::from))
    {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(FleetError(format!(
                "the shoal binary {} does not exist",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| FleetError(format!("cannot find the running executable: {e}")))?;
    let mut dir = exe
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| FleetError(format!("{} has no directory", exe.display())))?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(format!("shoal{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        return Ok(path);
    }
    let profile = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let flag = match profile.as_str() {
        "debug" => String::new(),
        "release" => " --release".to_string(),
        other => format!(" --profile {other}"),
    };
    Err(FleetError(format!(
        "the shoal binary is not at {}: build it first with `cargo build{flag} -p shoal` \
         (same profile as this program; `cargo test --workspace` builds it too), \
         or give its path with --shoal-bin PATH or ${SHOAL_BIN_ENV}",
        path.display()
    )))
}

/// Free loopback ports: `tcp` TCP ports then `udp` UDP ports, all distinct
/// within their protocol (bound together, then released).
pub fn free_ports(tcp: usize, udp: usize) -> Result<(Vec<u16>, Vec<u16>), FleetError> {
    let err = |e: std::io::Error| FleetError(format!("cannot pick a free port: {e}"));
    let tcp_socks = (0..tcp)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let udp_socks = (0..udp)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let tcp_ports = tcp_socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let udp_ports = udp_socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    Ok((tcp_ports, udp_ports))
}

/// Runs `shoal mesh gen-certs --out DIR --nodes NAMES`.
pub fn gen_certs(bin: &Path, dir: &Path, names: &[String]) -> Result<(), FleetError> {
    let out = Command::new(bin)
        .args(["mesh", "gen-certs", "--out"])
        .arg(dir)
        .args(["--nodes", &names.join(","), "--force"])
        .output()
        .map_err(|e| FleetError(format!("cannot run {}: {e}", bin.display())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(FleetError(format!(
            "`shoal mesh gen-certs` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// The last `lines` lines of a log file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `bin args...` with stdout and stderr appended to `log`, and waits
/// up to `timeout` for its `listening on http://ADDR` line; returns the
/// child and ADDR. The child is killed if it does not get there.
pub async fn spawn_logged(
    bin: &Path,
    args: &[String],
    envs: &[(String, String)],
    log: &Path,
    timeout: Duration,
) -> Result<(Child, String), FleetError> {
    let io_err = |e: std::io::Error| FleetError(format!("{}: {e}", log.display()));
    let mut out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io_err)?;
    let _ = writeln!(out, "=== {} {}", bin.display(), args.join(" "));
    let err_file = out.try_clone().map_err(io_err)?;
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err_file))
        .spawn()
        .map_err(|e| FleetError(format!("cannot start {}: {e}", bin.display())))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(out, "{line}");
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || ".:[]".contains(*c))
                        .collect();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
    }
    let failed = |child: &mut Child, why: String| {
        let _ = child.kill();
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        FleetError(format!(
            "{why} ({status}); last lines of {}:\n{}",
            log.display(),
            tail(log, 15)
        ))
    };
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(addr)) => Ok((child, addr)),
        Ok(Err(_)) => Err(failed(&mut child, "shoal exited before listening".into())),
        Err(_) => Err(failed(
            &mut child,
            format!("shoal did not log its address within {timeout:?}"),
        )),
    }
}
