//! A harness of real `shoal` replicas on loopback: certificates from
//! `shoal mesh gen-certs`, free ports, one child process per replica (named
//! `a`, `b`, `c`, ...), their `/mesh/status`, and the faults the tests need
//! (`kill -9`, SIGTERM, restart with the same name and ports, and replicas
//! added later under new names: [`Fleet::add_replica`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), shoal_tests::fleet::FleetError> {
//! use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};
//! let bin = locate_shoal(None)?;
//! let cfg = FleetConfig::new(bin, 3, vec!["http://127.0.0.1:18001".into()])
//!     .args(["--policy", "least_load"]);
//! let fleet = Fleet::start(cfg).await?;
//! fleet.wait_meshed(std::time::Duration::from_secs(20)).await?;
//! println!("{}", fleet.url(0));
//! # Ok(()) }
//! ```
//!
//! Children are killed when the [`Fleet`] is dropped; their stdout and
//! stderr go to `NAME.log` in the fleet's temporary directory.

mod process;
mod status;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

pub use process::{SHOAL_BIN_ENV, free_ports, gen_certs, locate_shoal, spawn_logged, tail};
pub use status::{Member, MeshStatus, Share, SnapshotInfo, WorkerLoad, same_url};

use crate::client::HttpClient;

/// Any failure of the harness, with a message meant for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetError(pub String);

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FleetError {}

/// How to start a fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The `shoal` binary.
    pub shoal_bin: PathBuf,
    /// Number of replicas (1..=26).
    pub replicas: usize,
    /// Engine base URLs every replica routes to.
    pub worker_urls: Vec<String>,
    /// Join the replicas in a mesh (certificates, gossip and QUIC ports).
    pub mesh: bool,
    /// Replica `i` serves HTTP on `base_port + i`; 0 picks free ports.
    /// Replicas added later ([`Fleet::add_replica`]) always get free ports.
    pub base_port: u16,
    /// Extra flags given to every replica.
    pub args: Vec<String>,
    /// How long a replica may take to log its address.
    pub start_timeout: Duration,
    /// Names of replicas to be added later with [`Fleet::add_replica`]:
    /// their certificates are made up front with the others' (one CA).
    pub spare_names: Vec<String>,
    /// Environment variables set for every replica (on top of the test's).
    pub envs: Vec<(String, String)>,
}

impl FleetConfig {
    /// `replicas` meshed replicas over `worker_urls` on free ports.
    pub fn new(shoal_bin: PathBuf, replicas: usize, worker_urls: Vec<String>) -> Self {
        Self {
            shoal_bin,
            replicas,
            worker_urls,
            mesh: true,
            base_port: 0,
            args: Vec::new(),
            start_timeout: Duration::from_secs(30),
            spare_names: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// Sets the environment variable `key` to `value` for every replica.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// Also makes certificates for `names`, so replicas of those names can
    /// join later ([`Fleet::add_replica`]).
    pub fn spare_names<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spare_names.extend(names.into_iter().map(Into::into));
        self
    }

    /// Turns the mesh on or off (off: independent replicas, the control).
    pub fn mesh(mut self, on: bool) -> Self {
        self.mesh = on;
        self
    }

    /// HTTP ports from `port` up (0: free ports).
    pub fn base_port(mut self, port: u16) -> Self {
        self.base_port = port;
        self
    }

    /// Adds flags for every replica.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// One replica: its name, ports, flags and (while running) its process.
#[derive(Debug)]
struct Replica {
    name: String,
    http_port: u16,
    gossip_port: u16,
    quic_port: u16,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

/// How many fresh HTTP ports a replica's first start tries after the
/// picked one turned out taken.
const PORT_RETRIES: usize = 3;

/// Whether a replica failed to start because its HTTP port was taken
/// (shoal's own message for it, in the log tail the error carries).
fn is_port_taken(e: &FleetError) -> bool {
    e.0.contains("cannot listen on") && e.0.contains("Address already in use")
}

impl Replica {
    /// Moves the replica to HTTP port `port` (before it first starts).
    fn move_http_port(&mut self, port: u16) {
        if let Some(at) = self.args.iter().position(|a| a == "--port")
            && let Some(value) = self.args.get_mut(at + 1)
        {
            *value = port.to_string();
            self.http_port = port;
        }
    }
}

/// Running `shoal` replicas; see the module docs.
#[derive(Debug)]
pub struct Fleet {
    dir: tempfile::TempDir,
    bin: PathBuf,
    start_timeout: Duration,
    mesh: bool,
    worker_urls: Vec<String>,
    extra_args: Vec<String>,
    envs: Vec<(String, String)>,
    /// Names with a certificate in `dir` (mesh on).
    cert_names: Vec<String>,
    replicas: Vec<Replica>,
    client: HttpClient,
}

const NAMES: &str = "abcdefghijklmnopqrstuvwxyz";

impl Fleet {
    /// Generates certificates (mesh on), picks ports and starts every
    /// replica, returning once each has logged its address.
    pub async fn start(cfg: FleetConfig) -> Result<Self, FleetError> {
        let n = cfg.replicas;
        if n == 0 || n > NAMES.len() {
            return Err(FleetError(format!("replicas must be 1..=26 (got {n})")));
        }
        let dir = tempfile::Builder::new()
            .prefix("shoal-fleet-")
            .tempdir()
            .map_err(|e| FleetError(format!("cannot create a temporary directory: {e}")))?;
        let names: Vec<String> = NAMES.chars().take(n).map(String::from).collect();
        if let Some(dup) = cfg.spare_names.iter().find(|s| names.contains(s)) {
            return Err(FleetError(format!(
                "spare name {dup} is also a replica's name ({names:?})"
            )));
        }
        let cert_names: Vec<String> = if cfg.mesh {
            let all: Vec<String> = names.iter().chain(&cfg.spare_names).cloned().collect();
            process::gen_certs(&cfg.shoal_bin, dir.path(), &all)?;
            all
        } else {
            Vec::new()
        };
        let (tcp, udp) = free_ports(if cfg.base_port == 0 { n } else { 0 }, 2 * n)?;
        let http_ports: Vec<u16> = if cfg.base_port == 0 {
            tcp
        } else {
            (0..n)
                .map(|i| {
                    u16::try_from(i)
                        .ok()
                        .and_then(|i| cfg.base_port.checked_add(i))
                })
                .collect::<Option<Vec<u16>>>()
                .ok_or_else(|| FleetError(format!("--base-port {} is too high", cfg.base_port)))?
        };
        let mut fleet = Self {
            dir,
            bin: cfg.shoal_bin,
            start_timeout: cfg.start_timeout,
            mesh: cfg.mesh,
            worker_urls: cfg.worker_urls,
            extra_args: cfg.args,
            envs: cfg.envs,
            cert_names,
            replicas: Vec::with_capacity(n),
            client: HttpClient::new(),
        };
        for (i, name) in names.iter().enumerate() {
            let peers: Vec<String> = (0..n)
                .filter(|&j| j != i)
                .map(|j| format!("127.0.0.1:{}", udp[2 * j]))
                .collect();
            let replica = fleet.replica(name, http_ports[i], udp[2 * i], udp[2 * i + 1], &peers);
            fleet.replicas.push(replica);
        }
        for i in 0..n {
            fleet.start_first_time(i, cfg.base_port == 0).await?;
        }
        Ok(fleet)
    }

    /// Starts replica `i` for the first time. Its HTTP port was picked free
    /// and then released, so another process (a parallel test's client
    /// socket takes its ephemeral port from the same range) can hold it
    /// before the replica binds; when `may_move` (nobody was given the
    /// port), the replica then gets a fresh one, up to
    /// [`PORT_RETRIES`] times.
    async fn start_first_time(&mut self, i: usize, may_move: bool) -> Result<(), FleetError> {
        let mut retries = 0;
        loop {
            match self.restart(i).await {
                Err(e) if may_move && retries < PORT_RETRIES && is_port_taken(&e) => {
                    retries += 1;
                    let (tcp, _) = free_ports(1, 0)?;
                    self.replicas[i].move_http_port(tcp[0]);
                }
                started => return started,
            }
        }
    }

    /// A replica's record with its command line (not started).
    fn replica(
        &self,
        name: &str,
        http_port: u16,
        gossip_port: u16,
        quic_port: u16,
        peers: &[String],
    ) -> Replica {
        // The tests' admin client is local; a replica needs this opt-in
        // to take admin writes without an admin key.
        let mut args: Vec<String> = vec![
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            http_port.to_string(),
            "--allow-loopback-admin-writes".into(),
        ];
        if !self.worker_urls.is_empty() {
            args.extend(["--worker-urls".into(), self.worker_urls.join(",")]);
        }
        if self.mesh {
            let file = |f: String| self.dir.path().join(f).to_string_lossy().into_owned();
            args.extend([
                "--mesh-name".into(),
                name.to_string(),
                "--mesh-host".into(),
                "127.0.0.1".into(),
                "--mesh-advertise-host".into(),
                "127.0.0.1".into(),
                "--mesh-port".into(),
                gossip_port.to_string(),
                "--mesh-quic-port".into(),
                quic_port.to_string(),
                "--mesh-tls-ca".into(),
                file("ca.pem".into()),
                "--mesh-tls-cert".into(),
                file(format!("{name}.pem")),
                "--mesh-tls-key".into(),
                file(format!("{name}-key.pem")),
            ]);
            if !peers.is_empty() {
                args.extend(["--mesh-peer-urls".into(), peers.join(",")]);
            }
        }
        args.extend(self.extra_args.iter().cloned());
        Replica {
            name: name.to_string(),
            http_port,
            gossip_port,
            quic_port,
            args,
            log: self.dir.path().join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts a new replica named `name` (a new node, not a restart) on free
    /// ports, seeded with the gossip addresses of the running replicas, and
    /// returns its index once it has logged its address. Its certificate
    /// must have been made up front: list the name in
    /// [`FleetConfig::spare_names`]. It is not waited for to mesh (see
    /// [`Fleet::wait_joined`] and [`Fleet::wait_meshed`]).
    pub async fn add_replica(&mut self, name: &str) -> Result<usize, FleetError> {
        if !self.mesh {
            return Err(FleetError(
                "add_replica needs a meshed fleet (FleetConfig::mesh(true))".into(),
            ));
        }
        if self.replicas.iter().any(|r| r.name == name) {
            return Err(FleetError(format!(
                "a replica named {name} exists already (use restart for a new incarnation)"
            )));
        }
        if !self.cert_names.iter().any(|c| c == name) {
            return Err(FleetError(format!(
                "no certificate for {name}: list it in FleetConfig::spare_names \
                 (certificates exist for {:?})",
                self.cert_names
            )));
        }
        let (tcp, udp) = free_ports(1, 2)?;
        let peers: Vec<String> = self
            .running()
            .into_iter()
            .map(|i| self.gossip_addr(i))
            .collect();
        let replica = self.replica(name, tcp[0], udp[0], udp[1], &peers);
        self.replicas.push(replica);
        let i = self.replicas.len() - 1;
        if let Err(e) = self.restart(i).await {
            self.replicas.pop();
            return Err(e);
        }
        Ok(i)
    }

    /// Number of replicas (running or not).
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether the fleet has no replicas (never, once started).
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Node name of replica `i` (`a`, `b`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.replicas[i].name
    }

    /// `http://127.0.0.1:PORT` of replica `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.replicas[i].http_port)
    }

    /// Gossip (UDP) address of replica `i`.
    pub fn gossip_addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.replicas[i].gossip_port)
    }

    /// QUIC load-plane (UDP) address of replica `i`.
    pub fn quic_addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.replicas[i].quic_port)
    }

    /// The temporary directory holding certificates and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `shoal` binary in use.
    pub fn shoal_bin(&self) -> &Path {
        &self.bin
    }

    /// The log file of replica `i`.
    pub fn log_path(&self, i: usize) -> &Path {
        &self.replicas[i].log
    }

    /// The last `lines` lines of replica `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        tail(&self.replicas[i].log, lines)
    }

    /// Process id of replica `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.replicas[i].child.as_ref().map(Child::id)
    }

    /// Whether replica `i` has a process (started and not reaped).
    pub fn is_running(&self, i: usize) -> bool {
        self.replicas[i].child.is_some()
    }

    /// Indexes of the running replicas.
    pub fn running(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.is_running(i)).collect()
    }

    /// `GET /mesh/status` of replica `i`.
    pub async fn status(&self, i: usize) -> Result<MeshStatus, FleetError> {
        let url = format!("{}/mesh/status", self.url(i));
        let resp = self
            .client
            .get(&url)
            .await
            .map_err(|e| FleetError(format!("{url}: {e}")))?;
        if resp.status != 200 {
            return Err(FleetError(format!(
                "{url} answered {}: {}",
                resp.status,
                resp.text()
            )));
        }
        serde_json::from_slice(&resp.body)
            .map_err(|e| FleetError(format!("{url}: not a mesh status: {e}")))
    }

    /// Waits until every running replica counts every other running one.
    pub async fn wait_meshed(&self, timeout: Duration) -> Result<(), FleetError> {
        self.wait_counting(timeout, true).await
    }

    /// Waits until every running replica counts every other running one,
    /// allowing extra counted names (e.g. a replica killed a moment ago that
    /// the others have not yet found dead). [`Fleet::wait_meshed`] is the
    /// exact form.
    pub async fn wait_joined(&self, timeout: Duration) -> Result<(), FleetError> {
        self.wait_counting(timeout, false).await
    }

    /// Waits until each running replica counts the other running ones:
    /// exactly those when `exact`, at least those otherwise.
    async fn wait_counting(&self, timeout: Duration, exact: bool) -> Result<(), FleetError> {
        let deadline = Instant::now() + timeout;
        let running = self.running();
        for &i in &running {
            let mut want: Vec<&str> = running
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| self.name(j))
                .collect();
            want.sort_unstable();
            loop {
                let seen = self.status(i).await;
                if let Ok(s) = &seen {
                    let counted = s.counted_names();
                    let done = if exact {
                        counted == want
                    } else {
                        want.iter().all(|w| counted.contains(w))
                    };
                    if done {
                        break;
                    }
                }
                if Instant::now() >= deadline {
                    let seen = match seen {
                        Ok(s) => format!("counted {:?}", s.counted_names()),
                        Err(e) => e.0,
                    };
                    return Err(FleetError(format!(
                        "replica {} does not count {want:?} after {timeout:?} ({seen}); log:\n{}",
                        self.name(i),
                        self.log_tail(i, 15)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// `kill -9` replica `i` and reaps it.
    pub fn kill9(&mut self, i: usize) -> Result<(), FleetError> {
        let mut child = self.replicas[i]
            .child
            .take()
            .ok_or_else(|| FleetError(format!("replica {} is not running", self.name(i))))?;
        child
            .kill()
            .map_err(|e| FleetError(format!("kill -9 {}: {e}", child.id())))?;
        let _ = child.wait();
        Ok(())
    }

    /// Sends SIGTERM to replica `i` (it drains, then exits).
    pub fn sigterm(&self, i: usize) -> Result<(), FleetError> {
        let pid = self
            .pid(i)
            .ok_or_else(|| FleetError(format!("replica {} is not running", self.name(i))))?;
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .map_err(|e| FleetError(format!("kill -TERM {pid}: {e}")))?;
        if ok.success() {
            Ok(())
        } else {
            Err(FleetError(format!("kill -TERM {pid} failed: {ok}")))
        }
    }

    /// Waits up to `timeout` for replica `i` to exit and reaps it.
    pub async fn wait_exit(
        &mut self,
        i: usize,
        timeout: Duration,
    ) -> Result<ExitStatus, FleetError> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = &mut self.replicas[i];
            let child = r
                .child
                .as_mut()
                .ok_or_else(|| FleetError(format!("replica {} is not running", r.name)))?;
            if let Some(status) = child
                .try_wait()
                .map_err(|e| FleetError(format!("wait: {e}")))?
            {
                self.replicas[i].child = None;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(FleetError(format!(
                    "replica {} still runs after {timeout:?}",
                    self.name(i)
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Adds `args` to replica `i`'s command line from its next (re)start
    /// on (later flags override earlier ones: `shoal` takes the last), e.g.
    /// a seed list of its own.
    pub fn append_args<I, S>(&mut self, i: usize, args: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Some(r) = self.replicas.get_mut(i) {
            r.args.extend(args.into_iter().map(Into::into));
        }
    }

    /// (Re)starts replica `i` with its name, ports and flags: a new
    /// incarnation. It must not be running.
    pub async fn restart(&mut self, i: usize) -> Result<(), FleetError> {
        let r = &self.replicas[i];
        if r.child.is_some() {
            return Err(FleetError(format!("replica {} is running", r.name)));
        }
        let (child, _addr) =
            process::spawn_logged(&self.bin, &r.args, &self.envs, &r.log, self.start_timeout)
                .await?;
        self.replicas[i].child = Some(child);
        Ok(())
    }

    /// Keeps the working directory (certificates and replica logs) after
    /// the fleet is dropped; returns where it is.
    pub fn keep_dir(&mut self) -> PathBuf {
        self.dir.disable_cleanup(true);
        self.dir.path().to_path_buf()
    }

    /// SIGTERM to every running replica, up to `grace` for them to drain and
    /// exit, then `kill -9` for the rest.
    pub async fn shutdown(&mut self, grace: Duration) {
        for i in 0..self.len() {
            let _ = self.sigterm(i);
        }
        let deadline = Instant::now() + grace;
        for i in 0..self.len() {
            if self.replicas[i].child.is_some() {
                let left = deadline.saturating_duration_since(Instant::now());
                if self.wait_exit(i, left).await.is_err() {
                    let _ = self.kill9(i);
                }
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for r in &mut self.replicas {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[cfg(test)]
mod port_retry_tests {
    use super::*;

    #[test]
    fn a_taken_port_is_recognised_and_a_replica_moves_off_it() {
        // shoal's message (router/src/app.rs) as the error's log tail has it.
        let taken = FleetError(
            "shoal exited before listening (exit status: 1); last lines of c.log:\n\
             error: cannot listen on 127.0.0.1:42497: Address already in use (os error 98)"
                .into(),
        );
        assert!(is_port_taken(&taken));
        assert!(!is_port_taken(&FleetError(
            "shoal exited before listening (exit status: 1); error: bad flag".into()
        )));
        let mut replica = Replica {
            name: "c".into(),
            http_port: 42497,
            gossip_port: 1,
            quic_port: 2,
            args: vec![
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                "42497".into(),
            ],
            log: PathBuf::from("c.log"),
            child: None,
        };
        replica.move_http_port(40000);
        assert_eq!(replica.http_port, 40000);
        assert_eq!(replica.args[3], "40000");
    }
}
