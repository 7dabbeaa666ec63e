//! `shoal mesh status --url URL`: a replica's `/mesh/status` as a table an
//! operator can read at a glance.
//!
//! The JSON is read as a generic value so the tool keeps working against a
//! replica of a slightly different version: unknown fields are ignored and
//! missing ones print as `-`.

use std::fmt::Write;
use std::time::Duration;

use serde_json::Value;

use crate::auth::Secret;
use crate::upstream;

/// Fetches `url/mesh/status` (with the replica's admin key, when it has
/// one) and parses it.
pub async fn fetch(url: &str, admin_key: Option<&Secret>) -> Result<Value, String> {
    let base = crate::url::normalize_url(url).map_err(|e| format!("--url: {e}"))?;
    let tls = crate::engine_tls::client_config(&crate::engine_tls::EngineTlsFiles::default())?;
    let client = upstream::build_client(Duration::from_secs(3), tls)
        .with_authorization(admin_key.and_then(crate::auth::bearer_header));
    let (status, body) = upstream::get(
        &client,
        &base,
        "/mesh/status",
        Duration::from_secs(10),
        16 << 20,
    )
    .await
    .map_err(|e| format!("{base}/mesh/status: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "{base}/mesh/status answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{base}/mesh/status is not JSON: {e}"))
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.into(),
        other => other.to_string(),
    }
}

fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "  {}", padded.join("  ").trim_end());
    };
    line(out, headers.to_vec());
    for row in rows {
        line(out, row.iter().map(String::as_str).collect());
    }
}

/// The replicas with requests in flight on a worker, `name=requests`:
/// replicas with none are left out, and the incarnation (`#generation`)
/// is shown only when two incarnations of one name both hold some.
fn shares(shares: &Value) -> String {
    let held: Vec<(&str, String)> = shares
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["requests"].as_u64().is_some_and(|n| n > 0))
        .map(|s| (s["replica"].as_str().unwrap_or("-"), text(&s["requests"])))
        .collect();
    let name = |replica: &str| replica.split('#').next().unwrap_or(replica).to_string();
    let twice = |replica: &str| {
        held.iter()
            .filter(|(other, _)| name(other) == name(replica))
            .count()
            > 1
    };
    let parts: Vec<String> = held
        .iter()
        .map(|(replica, n)| match twice(replica) {
            true => format!("{replica}={n}"),
            false => format!("{}={n}", name(replica)),
        })
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

/// Renders a `/mesh/status` document as plain-text tables.
pub fn render_table(status: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {} (generation {}) cluster {}  gossip {}  quic {}",
        text(&status["node"]),
        text(&status["generation"]),
        text(&status["cluster_id"]),
        text(&status["gossip_addr"]),
        text(&status["quic_addr"]),
    );
    // This replica first, so the count matches `shoal_mesh_members` (which
    // includes it).
    let me = vec![
        format!("{} (this replica)", text(&status["node"])),
        "yes".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
    ];
    let members: Vec<Vec<String>> = std::iter::once(me)
        .chain(status["members"].as_array().into_iter().flatten().map(|m| {
            [
                "name",
                "live",
                "verified",
                "counted",
                "readiness",
                "http_addr",
                "last_heartbeat_age_ms",
                "last_frame_age_ms",
            ]
            .iter()
            .map(|key| text(&m[*key]))
            .collect()
        }))
        .collect();
    let _ = writeln!(out, "\nmembers ({}, this replica included):", members.len());
    table(
        &mut out,
        &[
            "NAME",
            "LIVE",
            "VERIFIED",
            "COUNTED",
            "READINESS",
            "HTTP",
            "HEARTBEAT_MS",
            "FRAME_MS",
        ],
        &members,
    );
    let workers: Vec<Vec<String>> = status["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let shares = shares(&w["shares"]);
            vec![
                text(&w["worker"]),
                text(&w["inflight_requests"]),
                text(&w["inflight_tokens"]),
                text(&w["dispatched_since_poll"]),
                text(&w["snapshot"]["poller"]),
                text(&w["snapshot"]["age_ms"]),
                text(&w["owner"]),
                shares,
            ]
        })
        .collect();
    let _ = writeln!(out, "\nworkers ({}):", workers.len());
    table(
        &mut out,
        &[
            "WORKER",
            "REQUESTS",
            "TOKENS",
            "SINCE_POLL_TOKENS",
            "POLLER",
            "SNAP_AGE_MS",
            "OWNER",
            "REQUESTS_BY_REPLICA",
        ],
        &workers,
    );
    let traffic = &status["traffic"];
    if let Some(map) = traffic.as_object() {
        let _ = writeln!(out, "\ntraffic:");
        for (key, value) in map {
            let _ = writeln!(out, "  {key}: {}", text(value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_members_workers_and_shares() {
        let status = serde_json::json!({
            "node": "a", "generation": 7, "cluster_id": "c", "gossip_addr": "127.0.0.1:1", "quic_addr": "127.0.0.1:2",
            "members": [{"name": "b", "live": true, "verified": true, "counted": true, "readiness": "serving",
                         "http_addr": "127.0.0.1:3", "last_heartbeat_age_ms": 12, "last_frame_age_ms": 5}],
            "workers": [{"worker": "http://e:1", "inflight_requests": 3, "inflight_tokens": 900,
                         "dispatched_since_poll": 40, "owner": "b",
                         "snapshot": {"poller": "b", "age_ms": 200},
                         "shares": [{"replica": "a#7", "requests": 1}, {"replica": "b#9", "requests": 2}]}],
            "traffic": {"frames_sent": 10}
        });
        let table = render_table(&status);
        assert!(table.contains("node a (generation 7) cluster c"), "{table}");
        assert!(
            table.contains("members (2, this replica included):"),
            "{table}"
        );
        assert!(table.contains("a (this replica)"));
        assert!(
            table
                .lines()
                .any(|l| l.contains("b") && l.contains("serving") && l.contains("yes"))
        );
        assert!(
            table
                .lines()
                .any(|l| l.contains("http://e:1") && l.contains("a=1 b=2"))
        );
        let noisy = serde_json::json!([
            {"replica": "a#1796080425617757", "requests": 0},
            {"replica": "b#1", "requests": 2},
            {"replica": "b#2", "requests": 1}
        ]);
        assert_eq!(
            shares(&noisy),
            "b#1=2 b#2=1",
            "zeros left out; generations only to tell two apart"
        );
        assert_eq!(
            shares(&serde_json::json!([{"replica": "a#1", "requests": 0}])),
            "-"
        );
        assert!(table.contains("frames_sent: 10"));
    }

    #[test]
    fn missing_fields_print_as_dashes() {
        let table = render_table(&serde_json::json!({"node": "x"}));
        assert!(table.contains("node x (generation -)"), "{table}");
        assert!(
            table.contains("members (1, this replica included):"),
            "{table}"
        );
    }
}
