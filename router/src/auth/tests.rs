//! Keys, scopes and the loopback rule.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Method, header};

use super::*;

fn headers(auth: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
    h
}

fn keys(list: &[&str]) -> Keys {
    let secrets: Vec<Secret> = list.iter().map(|k| k.parse().unwrap()).collect();
    Keys::new(&secrets)
}

const LOCAL: Option<SocketAddr> = Some(SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    5000,
));
const REMOTE: Option<SocketAddr> = Some(SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 1, 2, 3)),
    5000,
));

#[test]
fn any_of_several_inference_keys_admits_and_nothing_else_does() {
    let auth = Auth::new(keys(&["sk-first-key", "sk-second-key"]), Keys::default());
    let inference = Scope::Inference;
    assert_eq!(
        auth.check(inference, &headers("Bearer sk-second-key"), REMOTE),
        Ok(())
    );
    assert_eq!(
        auth.check(inference, &headers("bearer  sk-first-key "), REMOTE),
        Ok(())
    );
    assert_eq!(
        auth.check(inference, &headers("Bearer sk-third-key"), REMOTE),
        Err(Denied::Invalid)
    );
    assert_eq!(
        auth.check(inference, &headers("Basic sk-first-key"), REMOTE),
        Err(Denied::Missing)
    );
    assert_eq!(
        auth.check(inference, &HeaderMap::new(), LOCAL),
        Err(Denied::Missing)
    );
    assert_eq!(auth.check(Scope::Open, &HeaderMap::new(), REMOTE), Ok(()));
    assert!(auth.guards_inference());
    let open = Auth::default();
    assert_eq!(open.check(inference, &HeaderMap::new(), REMOTE), Ok(()));
}

#[test]
fn the_admin_key_is_its_own_and_without_it_writes_are_refused_unless_loopback_is_allowed() {
    let auth = Auth::new(keys(&["sk-inference"]), keys(&["sk-admin-key"]));
    let write = Scope::Admin { write: true };
    let read = Scope::Admin { write: false };
    assert_eq!(
        auth.check(write, &headers("Bearer sk-admin-key"), REMOTE),
        Ok(())
    );
    assert_eq!(
        auth.check(read, &headers("Bearer sk-inference"), LOCAL),
        Err(Denied::Invalid)
    );
    assert_eq!(
        auth.check(read, &HeaderMap::new(), LOCAL),
        Err(Denied::Missing)
    );
    let no_admin = Auth::new(keys(&["sk-inference"]), Keys::default());
    for peer in [LOCAL, REMOTE, None] {
        assert_eq!(
            no_admin.check(write, &HeaderMap::new(), peer),
            Err(Denied::NoAdminKey),
            "no admin key: writes are refused from anywhere by default"
        );
    }
    assert_eq!(
        no_admin.check(read, &HeaderMap::new(), REMOTE),
        Ok(()),
        "reads stay open"
    );
    let loopback = no_admin.with_loopback_admin(true);
    assert_eq!(loopback.check(write, &HeaderMap::new(), LOCAL), Ok(()));
    let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
    assert_eq!(
        loopback.check(write, &HeaderMap::new(), Some(mapped)),
        Ok(()),
        "an IPv4-mapped loopback peer (dual-stack listener) is loopback"
    );
    let mapped_remote: SocketAddr = "[::ffff:10.1.2.3]:5000".parse().unwrap();
    for peer in [REMOTE, None, Some(mapped_remote)] {
        assert_eq!(
            loopback.check(write, &HeaderMap::new(), peer),
            Err(Denied::NotLoopback)
        );
    }
}

#[test]
fn an_anthropic_style_x_api_key_is_an_inference_key_and_never_an_admin_key() {
    let auth = Auth::new(keys(&["sk-inference"]), keys(&["sk-admin-key"]));
    let mut h = HeaderMap::new();
    h.insert("x-api-key", HeaderValue::from_static("sk-inference"));
    assert_eq!(auth.check(Scope::Inference, &h, REMOTE), Ok(()));
    h.insert("x-api-key", HeaderValue::from_static("sk-wrong-key"));
    assert_eq!(
        auth.check(Scope::Inference, &h, REMOTE),
        Err(Denied::Invalid)
    );
    h.insert("x-api-key", HeaderValue::from_static("sk-admin-key"));
    assert_eq!(
        auth.check(Scope::Admin { write: false }, &h, REMOTE),
        Err(Denied::Missing),
        "admin keys come as Bearer only"
    );
}

#[test]
fn scopes_follow_the_path_and_method() {
    assert_eq!(Scope::of(&Method::GET, "/v1/models"), Scope::Inference);
    assert_eq!(
        Scope::of(&Method::GET, "/workers"),
        Scope::Admin { write: false }
    );
    assert_eq!(
        Scope::of(&Method::POST, "/workers"),
        Scope::Admin { write: true }
    );
    assert_eq!(
        Scope::of(&Method::DELETE, "/workers/http%3A%2F%2Fw"),
        Scope::Admin { write: true }
    );
    assert_eq!(
        Scope::of(&Method::GET, "/mesh/status"),
        Scope::Admin { write: false }
    );
    assert_eq!(
        Scope::of(&Method::GET, "/tenants"),
        Scope::Admin { write: false },
        "tenant usage is the operators' to see"
    );
    for open in ["/health", "/readiness", "/liveness", "/metrics", "/nope"] {
        assert_eq!(Scope::of(&Method::GET, open), Scope::Open, "{open}");
    }
}

#[test]
fn secrets_never_print_and_bad_keys_are_refused_with_a_reason() {
    let secret: Secret = "sk-very-secret".parse().unwrap();
    assert_eq!(format!("{secret:?}"), "[redacted]");
    assert!(
        "short"
            .parse::<Secret>()
            .unwrap_err()
            .contains("at least 8")
    );
    assert!("has a space".parse::<Secret>().is_err());
    let header = bearer_header(&secret).unwrap();
    assert!(header.is_sensitive());
    assert_eq!(header, "Bearer sk-very-secret");
}

#[test]
fn a_keys_file_skips_comments_and_names_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, "# team a\nsk-team-a-key\n\n  sk-team-b-key  \n").unwrap();
    let keys = read_keys_file(&path).unwrap();
    assert_eq!(keys.len(), 2);
    std::fs::write(&path, "sk-good-key\nbad\n").unwrap();
    assert!(read_keys_file(&path).unwrap_err().contains("line 2"));
    assert!(read_keys_file(&dir.path().join("missing")).is_err());
    // Emptied (every key revoked): an error, never "no keys, open".
    std::fs::write(&path, "# all revoked\n\n   \n").unwrap();
    let empty = read_keys_file(&path).unwrap_err();
    assert!(empty.contains("holds no key"), "{empty}");
    std::fs::write(&path, "").unwrap();
    assert!(read_keys_file(&path).is_err());
}

#[test]
fn engines_get_the_worker_key_and_never_a_shoal_key() {
    let worker = bearer_header(&"sk-engine-key".parse().unwrap());
    let open = Auth::default();
    assert_eq!(
        open.forward(),
        Forward::Client,
        "no Shoal keys: the client's is for the engine"
    );
    let guarded = Auth::new(keys(&["sk-shoal-key"]), Keys::default());
    assert_eq!(guarded.forward(), Forward::Drop);
    let both = guarded.with_worker_key(worker.clone());
    assert_eq!(both.forward(), Forward::Worker(worker.as_ref().unwrap()));
    assert_eq!(both.worker_header(), worker.as_ref());
}
