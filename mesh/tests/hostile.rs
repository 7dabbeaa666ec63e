#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile peers beyond `security.rs` (another CA, a stolen name, junk): a
//! QUIC client with no certificate, replayed captured gossip and QUIC
//! datagrams, and forged chitchat state (Syn/SynAck/Ack exchanges of a
//! non-member that never holds a certificate). None may change any node's
//! fleet view: member set, poll owners, or in-flight totals.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chitchat::transport::UdpTransport;
use chitchat::{ChitchatConfig, ChitchatId, FailureDetectorConfig, ProtocolVersion};
use common::{Ca, Node, cluster, config, wait_for_full_mesh, wait_until};
use quinn::crypto::rustls::QuicClientConfig;

const WORKERS: [&str; 6] = [
    "http://10.3.0.1:8000",
    "http://10.3.0.2:8000",
    "http://10.3.0.3:8000",
    "http://10.3.0.4:8000",
    "http://10.3.0.5:8000",
    "http://10.3.0.6:8000",
];

/// What routing reads from one node: members, poll owner per worker, fleet
/// in-flight requests and tokens per worker.
type View = (Vec<String>, BTreeMap<String, (Option<String>, u64, u64)>);

fn view(node: &Node) -> View {
    let m = node.mesh();
    let per_worker = WORKERS
        .iter()
        .map(|w| {
            let f = m.worker(w).fleet();
            (
                w.to_string(),
                (m.owner(w), f.counts.requests, f.counts.tokens),
            )
        })
        .collect();
    (m.members(), per_worker)
}

/// Samples every node's view for `within`; returns the first difference
/// from `expected`, if any.
fn first_change(nodes: &[&Node], expected: &[View], within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        for (i, n) in nodes.iter().enumerate() {
            let now = view(n);
            if now != expected[i] {
                return Some(format!(
                    "node {i} changed:\n was {:?}\n now {now:?}",
                    expected[i]
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A cluster of `n` with bookings on every node, meshed and settled.
fn settled_cluster(ca: &Ca, n: usize) -> (Vec<Node>, Vec<mesh_slot::Held>) {
    let nodes = cluster(ca, n, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let mut held = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for (k, w) in WORKERS.iter().enumerate() {
            let slot = node.mesh().worker(w);
            slot.set_polled(true);
            held.push(slot.book(1, (10 * (i + 1) + k) as u64));
        }
    }
    let want = (n * WORKERS.len()) as u64;
    assert!(wait_until(Duration::from_secs(5), || {
        nodes.iter().all(|node| {
            WORKERS
                .iter()
                .map(|w| node.mesh().worker(w).fleet().counts.requests)
                .sum::<u64>()
                == want
        })
    }));
    // Every node polls every worker, so owners are spread and agreed on.
    assert!(wait_until(Duration::from_secs(5), || {
        WORKERS.iter().all(|w| {
            let owners: Vec<Option<String>> = nodes.iter().map(|x| x.mesh().owner(w)).collect();
            owners[0].is_some() && owners.iter().all(|o| *o == owners[0])
        })
    }));
    (nodes, held)
}

mod mesh_slot {
    /// A held booking (released on drop).
    pub type Held = shoal_mesh::SlotBooking;
}

#[test]
fn quic_client_without_a_certificate_changes_nothing() {
    let ca = Ca::new("ca");
    let (nodes, _held) = settled_cluster(&ca, 2);
    let refs: Vec<&Node> = nodes.iter().collect();
    let before: Vec<View> = refs.iter().map(|n| view(n)).collect();
    let dropped_before = nodes[0].mesh().status().traffic.frames_dropped;
    let target = nodes[0].mesh().quic_addr();
    // Trusts the cluster CA (so it would accept the server) but has no
    // certificate of its own.
    let mut roots = rustls::RootCertStore::empty();
    let ca_pem = match &ca.tls("x").ca {
        shoal_mesh::PemSource::Bytes(b) => b.clone(),
        other => panic!("unexpected {other:?}"),
    };
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&ca_pem) {
        let cert: rustls_pki_types::CertificateDer<'static> = cert.unwrap();
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![shoal_mesh::tls::ALPN.to_vec()];
    let outcome = nodes[0].block_on(async {
        let crypto = QuicClientConfig::try_from(Arc::new(client)).unwrap();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            let attempt = async {
                let conn = ep.connect(target, "n0")?.await?;
                // If the server let it in, try to speak anyway.
                let mut s = conn.open_uni().await?;
                let hello =
                    shoal_mesh::proto::frames::Frame::Hello(shoal_mesh::proto::frames::Hello {
                        cluster_id: "test-cluster".into(),
                        node: "n1".into(),
                        generation: u64::MAX,
                    });
                s.write_all(&shoal_mesh::proto::frames::encode_prefixed(&hello).unwrap())
                    .await?;
                // TLS 1.3: the client finishes first; the server then
                // checks the (missing) certificate and closes.
                let why = conn.closed().await;
                Ok::<_, Box<dyn std::error::Error>>(format!("closed by n0: {why}"))
            };
            let r = tokio::time::timeout(Duration::from_secs(3), attempt).await;
            outcomes.push(format!("{r:?}"));
        }
        ep.close(0u32.into(), b"");
        outcomes
    });
    println!("no-certificate attempts: {outcome:?}");
    assert!(
        outcome
            .iter()
            .all(|o| o.contains("no certificates") || o.contains("Err")),
        "{outcome:?}"
    );
    if let Some(change) = first_change(&refs, &before, Duration::from_millis(1500)) {
        panic!("a client without a certificate changed a view: {change}");
    }
    assert!(
        nodes[0].mesh().status().traffic.frames_dropped >= dropped_before,
        "counters never go backwards"
    );
}

/// One captured datagram: which relay leg it crossed and its bytes.
#[derive(Clone)]
struct Captured {
    towards_victim: bool,
    bytes: Vec<u8>,
}

/// A recording UDP relay: `front` (the address peers were told) forwards
/// to `target` through `up`, replies flow back to the last client.
struct Relay {
    front: Arc<UdpSocket>,
    up: Arc<UdpSocket>,
    log: Arc<Mutex<Vec<Captured>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn start(front: SocketAddr, target: SocketAddr) -> Self {
        let front = Arc::new(UdpSocket::bind(front).unwrap());
        let up = Arc::new(UdpSocket::bind("127.0.0.3:0").unwrap());
        front
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        up.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        {
            let (front, up, log, stop, client) = (
                front.clone(),
                up.clone(),
                log.clone(),
                stop.clone(),
                client.clone(),
            );
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok((n, from)) = front.recv_from(&mut buf) {
                        *client.lock().unwrap() = Some(from);
                        log.lock().unwrap().push(Captured {
                            towards_victim: false,
                            bytes: buf[..n].to_vec(),
                        });
                        let _ = up.send_to(&buf[..n], target);
                    }
                }
            });
        }
        {
            let (front, up, log, stop) = (front.clone(), up.clone(), log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok((n, _)) = up.recv_from(&mut buf) {
                        log.lock().unwrap().push(Captured {
                            towards_victim: true,
                            bytes: buf[..n].to_vec(),
                        });
                        if let Some(c) = *client.lock().unwrap() {
                            let _ = front.send_to(&buf[..n], c);
                        }
                    }
                }
            });
        }
        Self {
            front,
            up,
            log,
            stop,
        }
    }

    fn captured(&self) -> Vec<Captured> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Replays `packets` from the relay's sockets exactly as first seen:
/// towards the victim from `front` to `victim`, the rest from `up` to `other`.
fn replay(relay: &Relay, packets: &[Captured], victim: SocketAddr, other: SocketAddr) {
    for p in packets {
        if p.towards_victim {
            let _ = relay.front.send_to(&p.bytes, victim);
        } else {
            let _ = relay.up.send_to(&p.bytes, other);
        }
    }
}

/// n1 sits behind two recording relays (gossip and QUIC), so every datagram
/// between n0 and n1 is captured. Replaying all of them — while n1 lives,
/// and again after it crashed — changes neither view: QUIC drops replayed
/// packets (per-connection keys, packet numbers) and chitchat ignores stale
/// versions; and gossip alone never makes a peer count.
#[test]
fn replayed_gossip_and_quic_datagrams_change_no_view() {
    let ca = Ca::new("ca");
    let n0 = Node::start(config("n0", ca.tls("n0"), &[]));
    let mut c1 = config("n1", ca.tls("n1"), &[n0.mesh().gossip_addr()]);
    c1.gossip_bind = "127.0.0.2:0".parse().unwrap();
    c1.quic_bind = "127.0.0.2:0".parse().unwrap();
    c1.advertise_host = Some("127.0.0.3".into());
    let n1 = Node::start(c1);
    let (g1, q1) = (n1.mesh().gossip_addr(), n1.mesh().quic_addr());
    assert_eq!(g1.ip().to_string(), "127.0.0.3", "n1 advertises the relay");
    let at = |a: SocketAddr, ip: &str| SocketAddr::new(ip.parse().unwrap(), a.port());
    let gossip_relay = Relay::start(g1, at(g1, "127.0.0.2"));
    let quic_relay = Relay::start(q1, at(q1, "127.0.0.2"));
    assert!(wait_for_full_mesh(&[&n0, &n1], Duration::from_secs(10)));
    let _a = n0.mesh().worker(WORKERS[0]).book(1, 10);
    let b = n1.mesh().worker(WORKERS[0]).book(2, 20);
    assert!(wait_until(Duration::from_secs(5), || {
        n0.mesh().worker(WORKERS[0]).fleet().counts.requests == 2
    }));
    std::thread::sleep(Duration::from_millis(500));
    let gossip = gossip_relay.captured();
    let quic = quic_relay.captured();
    println!(
        "captured {} gossip and {} QUIC datagrams",
        gossip.len(),
        quic.len()
    );
    assert!(gossip.len() > 5 && quic.len() > 5);
    let n0_gossip = n0.mesh().gossip_addr();
    let n0_quic = n0.mesh().quic_addr();

    // 1. Both alive: everything replayed twice, both directions.
    let before = [view(&n0), view(&n1)];
    for _ in 0..2 {
        replay(&gossip_relay, &gossip, n0_gossip, at(g1, "127.0.0.2"));
        replay(&quic_relay, &quic, n0_quic, at(q1, "127.0.0.2"));
    }
    if let Some(change) = first_change(&[&n0, &n1], &before, Duration::from_millis(1500)) {
        panic!("replay while alive changed a view: {change}");
    }

    // 2. n1 crashes with its request; once n0 stopped counting them,
    // replaying n1's old datagrams must not bring them back.
    n1.crash();
    drop(b);
    assert!(wait_until(Duration::from_secs(10), || {
        n0.mesh().worker(WORKERS[0]).fleet().counts.requests == 1 && n0.mesh().members() == ["n0"]
    }));
    let after_crash = [view(&n0)];
    let replay_until = Instant::now() + Duration::from_secs(2);
    let mut rounds = 0;
    while Instant::now() < replay_until {
        replay(&gossip_relay, &gossip, n0_gossip, at(g1, "127.0.0.2"));
        replay(&quic_relay, &quic, n0_quic, at(q1, "127.0.0.2"));
        rounds += 1;
        if let Some(change) = first_change(&[&n0], &after_crash, Duration::from_millis(200)) {
            panic!("replay after the crash changed n0's view (round {rounds}): {change}");
        }
    }
    println!("{rounds} replay rounds after the crash changed nothing");
}

/// Runs a chitchat node that holds no certificate: it answers Syns with
/// SynAcks and sends Acks carrying whatever state it claims.
fn rogue_gossip(
    rt: &tokio::runtime::Runtime,
    name: &str,
    generation: u64,
    keys: Vec<(String, String)>,
    seed: SocketAddr,
) -> chitchat::ChitchatHandle {
    rt.block_on(async {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        drop(sock);
        let cfg = ChitchatConfig {
            chitchat_id: ChitchatId::new(name.to_string(), generation, addr),
            cluster_id: "test-cluster".into(),
            gossip_interval: Duration::from_millis(50),
            listen_addr: addr,
            seed_nodes: vec![seed.to_string()],
            failure_detector_config: FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        chitchat::spawn_chitchat(cfg, keys, &UdpTransport)
            .await
            .unwrap()
    })
}

fn keys(quic: SocketAddr, readiness: &str) -> Vec<(String, String)> {
    vec![
        ("quic_addr".into(), quic.to_string()),
        ("version".into(), "0.1.0".into()),
        ("readiness".into(), readiness.into()),
        ("http_addr".into(), "127.0.0.1:1".into()),
    ]
}

/// Non-members gossip their way in under new names, one pointing its
/// load-plane address at a real member's: members, poll owners and fleet
/// totals stay the same on every node.
#[test]
fn forged_gossip_under_new_names_changes_no_routing() {
    let ca = Ca::new("ca");
    let (nodes, _held) = settled_cluster(&ca, 3);
    let refs: Vec<&Node> = nodes.iter().collect();
    let before: Vec<View> = refs.iter().map(|n| view(n)).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seed = nodes[0].mesh().gossip_addr();
    let n1_quic = nodes[1].mesh().quic_addr();
    let _ghost = rogue_gossip(&rt, "ghost", 1, keys(n1_quic, "serving"), seed);
    let _zz = rogue_gossip(
        &rt,
        "zz",
        2,
        keys("127.0.0.1:9".parse().unwrap(), "serving"),
        seed,
    );
    assert!(wait_until(Duration::from_secs(5), || {
        let st = nodes[2].mesh().status();
        ["ghost", "zz"]
            .iter()
            .all(|g| st.members.iter().any(|m| m.name == *g && m.live))
    }));
    if let Some(change) = first_change(&refs, &before, Duration::from_secs(3)) {
        panic!("forged gossip changed routing: {change}");
    }
    let st = nodes[0].mesh().status();
    for m in st
        .members
        .iter()
        .filter(|m| m.name == "ghost" || m.name == "zz")
    {
        assert!(!m.verified && !m.counted, "{m:?}");
    }
}

/// A non-member (no certificate) gossips a newer incarnation of a member,
/// pointing at an address where nobody holds that member's certificate,
/// either `serving` or `left`. Nothing of the fleet view may change.
fn forged_incarnation(readiness: &str) {
    let ca = Ca::new("ca");
    let (nodes, _held) = settled_cluster(&ca, 3);
    let refs: Vec<&Node> = nodes.iter().collect();
    let before: Vec<View> = refs.iter().map(|n| view(n)).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seed = nodes[0].mesh().gossip_addr();
    let newer = nodes[2].mesh().incarnation().generation + 1_000_000;
    let fake = "127.0.0.1:9".parse().unwrap();
    let _n2 = rogue_gossip(&rt, "n2", newer, keys(fake, readiness), seed);
    // First prove the forgery arrived (the members' gossip lists it), so
    // the absence of a change below is not the absence of the attack.
    let seen = |n: &&Node| {
        n.mesh()
            .status()
            .members
            .iter()
            .any(|m| m.name == "n2" && m.generation == newer)
    };
    assert!(
        wait_until(Duration::from_secs(10), || refs.iter().any(seen)),
        "the forged incarnation never reached the members' gossip"
    );
    if let Some(change) = first_change(&refs, &before, Duration::from_secs(4)) {
        panic!("a forged incarnation ({readiness}) changed routing: {change}");
    }
}

#[test]
fn forged_newer_serving_incarnation_of_a_member_changes_no_routing() {
    forged_incarnation("serving");
}

#[test]
fn forged_newer_left_incarnation_of_a_member_changes_no_routing() {
    forged_incarnation("left");
}
