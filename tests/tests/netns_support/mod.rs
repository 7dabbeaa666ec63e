//! A small lab of "hosts" made of Linux network namespaces the test creates
//! itself: one bridge namespace (`PREFIX-hub`) and one namespace per host,
//! each joined to the bridge by a veth pair and given an address on a
//! private /24. Processes run inside with `ip netns exec`; a partition is a
//! pair of blackhole routes between two hosts. Everything (children, namespaces) is
//! removed on drop, also when the test panics.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod forward;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why the lab cannot run here (not root, no `ip`), if it cannot.
pub fn unsupported() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        return Some(format!(
            "not root (uid {uid:?}): network namespaces need CAP_NET_ADMIN"
        ));
    }
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ip {
        return Some("`ip` (iproute2) is not installed".into());
    }
    None
}

/// Runs `cmd args`, failing with its stderr.
pub fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{cmd} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes namespaces of earlier runs whose process is gone (a run killed
/// with SIGKILL cannot clean up after itself).
fn reap_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("shl")
            .and_then(|rest| rest.split('x').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh("ip", &["netns", "del", name]);
        }
    }
}

/// One host: namespace, bridge port (in the hub), address.
#[derive(Debug, Clone)]
pub struct Host {
    /// Short name (`a`, `eng`, ...).
    pub name: String,
    /// Namespace name.
    pub ns: String,
    /// The veth end in the hub namespace.
    pub port: String,
    /// IPv4 address on the lab subnet.
    pub ip: String,
}

/// The namespaces, the processes in them and a scratch directory.
pub struct Lab {
    /// Unique per run: `shl<pid>x<n>`.
    pub prefix: String,
    hub: String,
    hosts: Vec<Host>,
    children: Vec<(String, Child)>,
    dir: tempfile::TempDir,
}

impl Lab {
    /// Creates the hub and one namespace per `(name, ip)` on 10.99.0.0/24.
    pub fn new(hosts: &[(&str, &str)]) -> Result<Self, String> {
        reap_stale();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() % 100_000)
            .unwrap_or(0);
        let prefix = format!("shl{}x{nanos}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("shoal-netns-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut lab = Self {
            hub: format!("{prefix}-hub"),
            prefix,
            hosts: Vec::new(),
            children: Vec::new(),
            dir,
        };
        let hub = lab.hub.clone();
        sh("ip", &["netns", "add", &hub])?;
        // Registered before any further step, so Drop deletes it on failure.
        lab.hosts.push(Host {
            name: "hub".into(),
            ns: hub.clone(),
            port: String::new(),
            ip: String::new(),
        });
        sh("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        sh("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        for (i, (name, ip)) in hosts.iter().enumerate() {
            let ns = format!("{}-{name}", lab.prefix);
            sh("ip", &["netns", "add", &ns])?;
            let port = format!("p{i}");
            lab.hosts.push(Host {
                name: name.to_string(),
                ns: ns.clone(),
                port: port.clone(),
                ip: ip.to_string(),
            });
            sh(
                "ip",
                &[
                    "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ],
            )?;
            sh("ip", &["-n", &hub, "link", "set", &port, "master", "br0"])?;
            sh("ip", &["-n", &hub, "link", "set", &port, "up"])?;
            sh(
                "ip",
                &["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
            sh("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// The scratch directory (certificates, logs, sockets).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Log file of process `key`.
    pub fn log(&self, key: &str) -> PathBuf {
        self.dir.path().join(format!("{key}.log"))
    }

    /// The last lines of process `key`'s log.
    pub fn log_tail(&self, key: &str, lines: usize) -> String {
        shoal_tests::fleet::tail(&self.log(key), lines)
    }

    /// Starts `bin args` in host `host` as process `key` (stdout and stderr
    /// to its log); with `ready = (marker, timeout)` it waits for `marker`
    /// in the log.
    pub fn spawn(
        &mut self,
        key: &str,
        host: &str,
        bin: &Path,
        args: &[String],
        env: &[(&str, String)],
        ready: Option<(&str, Duration)>,
    ) -> Result<(), String> {
        let ns = self.host(host).ns.clone();
        let log = self.log(key);
        let mut out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        let _ = writeln!(out, "=== [{ns}] {} {}", bin.display(), args.join(" "));
        let start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(bin)
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("ip netns exec {ns} {}: {e}", bin.display()))?;
        self.children.push((key.to_string(), child));
        let Some((marker, ready)) = ready else {
            return Ok(());
        };
        let deadline = Instant::now() + ready;
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            let fresh = String::from_utf8_lossy(text.get(start as usize..).unwrap_or_default());
            if fresh.contains(marker) {
                return Ok(());
            }
            if Instant::now() >= deadline || self.exited(key).is_some() {
                return Err(format!(
                    "{key} did not log `{marker}` within {ready:?}:\n{}",
                    self.log_tail(key, 15)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn child(&mut self, key: &str) -> Option<&mut Child> {
        self.children
            .iter_mut()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, c)| c)
    }

    /// The exit status of `key` if it has exited.
    pub fn exited(&mut self, key: &str) -> Option<ExitStatus> {
        self.child(key).and_then(|c| c.try_wait().ok().flatten())
    }

    /// `kill -9` process `key` and reaps it.
    pub fn kill9(&mut self, key: &str) {
        if let Some(c) = self.child(key) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM to process `key` (`ip netns exec` execs it, so the
    /// child's pid is the process itself).
    pub fn sigterm(&mut self, key: &str) -> Result<(), String> {
        let pid = self
            .child(key)
            .map(|c| c.id())
            .ok_or_else(|| format!("no process {key}"))?;
        sh("kill", &["-TERM", &pid.to_string()])
    }

    /// Waits up to `timeout` for `key` to exit.
    pub fn wait_exit(&mut self, key: &str, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited(key) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!("{key} still runs after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn blackholes(&self, cut: &str, peers: &[&str], verb: &str) -> Result<(), String> {
        let host = self.host(cut).clone();
        for peer in peers {
            let peer = self.host(peer).clone();
            // The cut host drops what it sends to the peer, the peer what it
            // sends to the cut host: no packet crosses either way.
            for (ns, to) in [(&host.ns, &peer.ip), (&peer.ns, &host.ip)] {
                sh(
                    "ip",
                    &["-n", ns, "route", verb, "blackhole", &format!("{to}/32")],
                )?;
            }
        }
        Ok(())
    }

    /// Partitions host `cut` from `peers` in both directions with blackhole
    /// routes (this kernel has no netem/prio qdiscs); its links to every
    /// other host keep working.
    pub fn partition(&self, cut: &str, peers: &[&str]) -> Result<(), String> {
        self.blackholes(cut, peers, "add")
    }

    /// Removes the partition of `cut` from `peers`.
    pub fn heal(&self, cut: &str, peers: &[&str]) -> Result<(), String> {
        self.blackholes(cut, peers, "del")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for host in self.hosts.iter().rev() {
            let _ = sh("ip", &["netns", "del", &host.ns]);
        }
    }
}
