//! Client traffic from the client namespace: an agent there (the test
//! binary re-run with `ip netns exec`) connects to the replicas; the test
//! reaches it over Unix sockets, which are not tied to a network namespace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};

/// Runs the agent: `spec` is `DIR|HOST:PORT,...`; it forwards
/// `DIR/fwd-I.sock` to target I until its parent process goes away.
pub fn agent(spec: &str) {
    let (dir, targets) = spec.split_once('|').unwrap();
    let targets: Vec<String> = targets.split(',').map(str::to_string).collect();
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        for (i, target) in targets.into_iter().enumerate() {
            let listener = UnixListener::bind(dir.join(format!("fwd-{i}.sock"))).unwrap();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let target = target.clone();
                    tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(&target).await {
                            let _ = out.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                }
            });
        }
        println!("agent ready");
        let parent = std::os::unix::process::parent_id();
        while std::os::unix::process::parent_id() == parent {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// Serves `127.0.0.1:0` in the test's namespace and carries every
/// connection to the agent's Unix socket `sock`; returns the base URL.
pub async fn forward(sock: PathBuf) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let sock = sock.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = UnixStream::connect(&sock).await {
                    let _ = inbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    url
}
