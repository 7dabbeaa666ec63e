//! Shared test support: a throwaway CA, node certificates and nodes that
//! each run on their own runtime, so a test can crash one (drop its runtime
//! without any goodbye) while the others keep running.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use shoal_mesh::{FailureDetectorSettings, Mesh, MeshConfig, PemSource, TlsConfig};
use shoal_tests::wait::{POLL_EVERY, poll_until_blocking};

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// mTLS material for a node whose certificate names `cert_name`.
    pub fn tls(&self, cert_name: &str) -> TlsConfig {
        let mut params = CertificateParams::new(vec![cert_name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, cert_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        TlsConfig {
            ca: PemSource::Bytes(self.issuer.pem().into_bytes()),
            cert: PemSource::Bytes(cert.pem().into_bytes()),
            key: PemSource::Bytes(key.serialize_pem().into_bytes()),
        }
    }
}

/// A config with test timings: 20 ms sync, fast anti-entropy and failure
/// detection.
pub fn config(name: &str, tls: TlsConfig, seeds: &[SocketAddr]) -> MeshConfig {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut c = MeshConfig::new(name, "test-cluster", any, any, tls);
    c.seeds = seeds.iter().map(|s| s.to_string()).collect();
    c.anti_entropy_interval = Duration::from_millis(300);
    c.failure_detector = FailureDetectorSettings {
        gossip_interval: Duration::from_millis(50),
        phi_threshold: 8.0,
        sampling_window: 100,
        max_interval: Duration::from_secs(1),
        initial_interval: Duration::from_millis(100),
        dead_node_grace_period: Duration::from_secs(60),
    };
    c.link_idle_timeout = Duration::from_millis(1000);
    c.link_keepalive = Duration::from_millis(200);
    c
}

/// A mesh node on its own runtime.
pub struct Node {
    pub mesh: Option<Mesh>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Node {
    pub fn start(config: MeshConfig) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mesh = rt.block_on(Mesh::start(config)).unwrap();
        Self {
            mesh: Some(mesh),
            rt: Some(rt),
        }
    }

    pub fn mesh(&self) -> &Mesh {
        self.mesh.as_ref().unwrap()
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.as_ref().unwrap().block_on(f)
    }

    /// Dies without a word: every task and socket vanishes at once.
    pub fn crash(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        drop(self.mesh.take());
    }

    /// Leaves gracefully.
    pub fn stop(mut self) {
        let mesh = self.mesh.take().unwrap();
        let rt = self.rt.take().unwrap();
        rt.block_on(mesh.shutdown());
        rt.shutdown_timeout(Duration::from_millis(200));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            drop(self.mesh.take());
            rt.shutdown_background();
        }
    }
}

/// Starts `n` nodes named `n0..` seeded by the first, sharing one CA.
pub fn cluster(ca: &Ca, n: usize, tweak: impl Fn(&mut MeshConfig)) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..n {
        let name = format!("n{i}");
        let seeds: Vec<SocketAddr> = nodes
            .first()
            .map(|f| f.mesh().gossip_addr())
            .into_iter()
            .collect();
        let mut c = config(&name, ca.tls(&name), &seeds);
        tweak(&mut c);
        nodes.push(Node::start(c));
    }
    nodes
}

/// Polls `cond` every [`POLL_EVERY`] until it holds or `within` passes
/// (the shared wait, `shoal_tests::wait`, on this crate's plain threads).
pub fn wait_until(within: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_until_blocking(POLL_EVERY, within, cond)
}

/// Polls `cond` every `period` until it holds or `within` passes (a longer
/// period for conditions that read a whole status).
pub fn wait_every(period: Duration, within: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_until_blocking(period, within, cond)
}

/// Waits until every node counts all the others.
pub fn wait_for_full_mesh(nodes: &[&Node], within: Duration) -> bool {
    let n = nodes.len();
    wait_until(within, || {
        nodes.iter().all(|node| node.mesh().members().len() == n)
    })
}

/// A peer the test controls, holding a valid cluster certificate for its
/// name: it says `Hello` to one node and then writes whatever frames the
/// test gives it (its link counts while it is connected; it never reads
/// what the node sends).
pub struct RawPeer {
    endpoint: quinn::Endpoint,
    _conn: quinn::Connection,
    send: quinn::SendStream,
}

impl RawPeer {
    /// Connects to `node` as `name` (certified by `ca`) and says `Hello`.
    pub fn connect(node: &Node, ca: &Ca, name: &str) -> Self {
        use quinn::crypto::rustls::QuicClientConfig;
        use shoal_mesh::proto::frames::{Frame, Hello, encode_prefixed};
        let tls = shoal_mesh::tls::load(&ca.tls(name), Some(name)).unwrap();
        let target = node.mesh().quic_addr();
        let node_name = node.mesh().incarnation().name.to_string();
        node.block_on(async {
            let crypto = QuicClientConfig::try_from(tls.client.clone()).unwrap();
            let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
            endpoint
                .set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(crypto)));
            let conn = endpoint.connect(target, &node_name).unwrap().await.unwrap();
            let mut send = conn.open_uni().await.unwrap();
            let hello = Frame::Hello(Hello {
                cluster_id: "test-cluster".into(),
                node: name.into(),
                generation: 1,
            });
            send.write_all(&encode_prefixed(&hello).unwrap())
                .await
                .unwrap();
            Self {
                endpoint,
                _conn: conn,
                send,
            }
        })
    }

    /// Writes `frame` (on `node`'s runtime, where the connection lives).
    pub fn send(&mut self, node: &Node, frame: &shoal_mesh::proto::frames::Frame) {
        let bytes = shoal_mesh::proto::frames::encode_prefixed(frame).unwrap();
        node.block_on(self.send.write_all(&bytes)).unwrap();
    }

    /// Closes the connection.
    pub fn close(self) {
        self.endpoint.close(0u32.into(), b"");
    }
}
