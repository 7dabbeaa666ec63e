//! The load view a replica's dry run (`POST /debug/route`) reports, and
//! what differs between replicas' views when they name different engines:
//! the agreement probe counts its misses by that cause, so a change meant
//! to raise agreement can be aimed at the news that actually differs.

use serde_json::Value;

/// One candidate's load as a dry run reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CandidateView {
    /// Fleet in-flight requests.
    pub requests: u64,
    /// Fleet in-flight token-work.
    pub tokens: u64,
    /// Fleet prompt tokens waiting for a first byte.
    pub pending_prefill: u64,
    /// Fleet token-work routed since the engine's last snapshot.
    pub since_poll: u64,
    /// The engine's own figures from that snapshot.
    pub engine: EngineView,
}

/// The engine's polled figures in a dry run's view (all missing without a
/// fresh snapshot).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineView {
    /// Queued prompt tokens.
    pub queued_tokens: Option<u64>,
    /// Generation throughput, tokens/s.
    pub gen_throughput: Option<f64>,
    /// KV-cache usage, 0..=1.
    pub kv_usage: Option<f64>,
}

impl std::fmt::Display for CandidateView {
    /// `requests/tokens/pending_prefill/since_poll/queued/throughput/kv`,
    /// `-` for missing.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        write!(
            f,
            "{}/{}/{}/{}/{}/{}/{}",
            self.requests,
            self.tokens,
            self.pending_prefill,
            self.since_poll,
            opt(self.engine.queued_tokens.map(|q| q.to_string())),
            opt(self.engine.gen_throughput.map(|t| format!("{t:.1}"))),
            opt(self.engine.kv_usage.map(|k| format!("{k:.3}"))),
        )
    }
}

/// What a log line calls the fields of [`CandidateView`]'s display.
pub const VIEW_FIELDS: &str = "in-flight/tokens/pending-prefill/since-poll/queued/throughput/kv";

/// Each candidate's load in a dry-run answer, in the answer's order.
pub fn parse(answer: &Value) -> Vec<CandidateView> {
    let Some(loads) = answer["loads"].as_array() else {
        return Vec::new();
    };
    loads
        .iter()
        .map(|l| CandidateView {
            requests: l["requests"].as_u64().unwrap_or(0),
            tokens: l["tokens"].as_u64().unwrap_or(0),
            pending_prefill: l["pending_prefill"].as_u64().unwrap_or(0),
            since_poll: l["since_poll"].as_u64().unwrap_or(0),
            engine: EngineView {
                queued_tokens: l["engine_queued_tokens"].as_u64(),
                gen_throughput: l["engine_gen_throughput"].as_f64(),
                kv_usage: l["engine_kv_usage"].as_f64(),
            },
        })
        .collect()
}

/// What differs between replicas' load views, the first that applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewDifference {
    /// Some candidate's in-flight requests, tokens or pending prefill: a
    /// booking, first byte or release one replica has and another has
    /// not received yet.
    InFlight,
    /// Only an engine snapshot, or the work counted since it: poll news
    /// (a snapshot or a peer's rebased count) not yet everywhere.
    PollNews,
    /// Nothing: the same view gave different answers, which only a policy
    /// that is not a function of its view can do.
    Nothing,
}

/// What differs between `views` (one per replica, candidates in the same
/// order).
pub fn difference(views: &[&[CandidateView]]) -> ViewDifference {
    let in_flight = |view: &[CandidateView]| -> Vec<(u64, u64, u64)> {
        view.iter()
            .map(|c| (c.requests, c.tokens, c.pending_prefill))
            .collect()
    };
    if views.windows(2).any(|w| in_flight(w[0]) != in_flight(w[1])) {
        ViewDifference::InFlight
    } else if views.windows(2).any(|w| w[0] != w[1]) {
        ViewDifference::PollNews
    } else {
        ViewDifference::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(requests: u64, since_poll: u64, throughput: f64) -> CandidateView {
        CandidateView {
            requests,
            tokens: requests * 100,
            pending_prefill: 0,
            since_poll,
            engine: EngineView {
                queued_tokens: Some(0),
                gen_throughput: Some(throughput),
                kv_usage: Some(0.5),
            },
        }
    }

    #[test]
    fn differences_are_told_apart_in_flight_first() {
        let a = vec![view(3, 10, 400.0), view(5, 0, 300.0)];
        let mut booked = a.clone();
        booked[1] = view(6, 100, 300.0);
        let mut polled = a.clone();
        polled[0] = view(3, 0, 410.0);
        let mut rebased = a.clone();
        rebased[0].since_poll = 0;
        assert_eq!(difference(&[&a, &booked]), ViewDifference::InFlight);
        assert_eq!(
            difference(&[&a, &polled, &booked]),
            ViewDifference::InFlight
        );
        assert_eq!(difference(&[&a, &polled]), ViewDifference::PollNews);
        assert_eq!(difference(&[&a, &rebased]), ViewDifference::PollNews);
        assert_eq!(difference(&[&a, &a]), ViewDifference::Nothing);
    }

    #[test]
    fn a_dry_run_answer_parses_into_views() {
        let answer = serde_json::json!({"loads": [
            {"worker": "http://a", "requests": 2, "tokens": 300, "since_poll": 40,
             "pending_prefill": 7, "engine_queued_tokens": 12,
             "engine_gen_throughput": 512.5, "engine_kv_usage": 0.25},
            {"worker": "http://b", "requests": 0, "tokens": 0, "since_poll": 0,
             "pending_prefill": 0, "engine_queued_tokens": null}
        ]});
        let views = parse(&answer);
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].to_string(), "2/300/7/40/12/512.5/0.250");
        assert_eq!(views[0].pending_prefill, 7);
        assert_eq!(views[1].to_string(), "0/0/0/0/-/-/-");
    }
}
