//! Chitchat's UDP transport, pre-bound (so the node knows its gossip port
//! before chitchat starts) and counting gossip bytes.
//!
//! Chitchat decodes datagrams inside its own socket type and silently drops
//! (and logs) those that do not parse; its wire format is crate-private, so
//! undecodable gossip datagrams cannot be counted from here. Only valid
//! traffic is counted.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::ChitchatMessage;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket};

use crate::core::Core;

/// A transport that hands chitchat one socket bound in advance.
pub(crate) struct PreBound {
    socket: Mutex<Option<Box<dyn Socket>>>,
    core: Arc<Core>,
}

impl PreBound {
    /// Binds the gossip socket now; returns the transport and bound address.
    pub(crate) async fn bind(
        addr: SocketAddr,
        core: Arc<Core>,
    ) -> anyhow::Result<(Self, SocketAddr)> {
        let socket = UdpSocket::open(addr).await?;
        let local = socket.local_addr()?;
        Ok((
            Self {
                socket: Mutex::new(Some(Box::new(socket))),
                core,
            },
            local,
        ))
    }
}

#[async_trait]
impl Transport for PreBound {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| anyhow::anyhow!("gossip socket already opened"))?;
        Ok(Box::new(Counting {
            inner: socket,
            core: self.core.clone(),
        }))
    }
}

struct Counting {
    inner: Box<dyn Socket>,
    core: Arc<Core>,
}

#[async_trait]
impl Socket for Counting {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let outcome = self.inner.send(to, envelope).await?;
        self.core.telemetry.gossip_sent(outcome.num_bytes_sent);
        Ok(outcome)
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        let outcome = self.inner.recv().await?;
        if matches!(outcome.envelope.message, ChitchatMessage::BadCluster) {
            self.core.telemetry.dropped("gossip_bad_cluster");
        }
        self.core
            .telemetry
            .gossip_received(outcome.num_bytes_received);
        Ok(outcome)
    }
}
