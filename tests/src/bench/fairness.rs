//! The fair-share and priority benchmark's load (`fairness-bench`):
//! closed-loop clients, each sending its next request when the last is
//! answered, each request to a replica picked at random (seeded), and what
//! each answer says: its status, the token-work the engine reported, and
//! for streams the time to the first token.
//!
//! Kept apart from the bin so the bin stays a plan and a table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::task::JoinSet;

use crate::client::HttpClient;
use crate::workload::{chat, text};

/// One group of identical clients.
#[derive(Debug, Clone)]
pub struct Clients {
    /// The group's name in the table.
    pub label: String,
    /// The tenant key every request presents.
    pub key: String,
    /// Clients sending at once.
    pub count: usize,
    /// Characters of each prompt (about four per token).
    pub prompt_chars: usize,
    /// Output tokens each request asks for.
    pub max_tokens: u64,
    /// Streamed requests (TTFT measured) or whole answers (usage read).
    pub stream: bool,
    /// Extra request headers (a priority, a fairness id).
    pub headers: Vec<(String, String)>,
    /// How long a client waits after a 429 or 503 before its next request
    /// (a client that backs off, as `Retry-After` asks).
    pub backoff: Duration,
    /// This share of the requests goes to replica 0, the rest uniformly to
    /// the others (`None`: uniformly to all).
    pub skew: Option<f64>,
}

impl Clients {
    /// A replica out of `n` for the next request.
    fn pick(&self, rng: &mut StdRng, n: usize) -> usize {
        match self.skew {
            Some(share) if n > 1 && !rng.random_bool(share.clamp(0.0, 1.0)) => {
                1 + rng.random_range(0..n - 1)
            }
            Some(_) => 0,
            None => rng.random_range(0..n),
        }
    }
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status (0: the request failed outright).
    pub status: u16,
    /// `error.code` of a refusal.
    pub code: Option<String>,
    /// Prompt plus completion tokens the engine reported (whole answers).
    pub work: u64,
    /// Time to the first streamed event (streams answered 200).
    pub ttft: Option<Duration>,
    /// When the answer ended, from the offer's start.
    pub done_at: Duration,
}

/// Runs `group` for `span` against `urls` (from `start`) and returns every
/// answer.
pub async fn closed_loop(
    client: &HttpClient,
    urls: Arc<Vec<String>>,
    group: Arc<Clients>,
    span: Duration,
    seed: u64,
    start: Instant,
) -> Vec<Answer> {
    let mut tasks = JoinSet::new();
    for c in 0..group.count {
        let (client, urls, group) = (client.clone(), urls.clone(), group.clone());
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(7919).wrapping_add(c as u64));
            let mut answers = Vec::new();
            let mut k = 0u64;
            while start.elapsed() < span {
                let base = &urls[group.pick(&mut rng, urls.len())];
                let prompt = text(seed ^ ((c as u64) << 32) ^ k, group.prompt_chars);
                let answer = one(&client, base, &group, &prompt, start).await;
                let refused = matches!(answer.status, 429 | 503);
                answers.push(answer);
                if refused {
                    tokio::time::sleep(group.backoff).await;
                }
                k += 1;
            }
            answers
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(answers) = done {
            out.extend(answers);
        }
    }
    out
}

/// Sends one request of `group` to `base` and reads its answer.
async fn one(
    client: &HttpClient,
    base: &str,
    group: &Clients,
    prompt: &str,
    start: Instant,
) -> Answer {
    let url = format!("{base}/v1/chat/completions");
    let auth = format!("Bearer {}", group.key);
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend(group.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let body = Bytes::from(chat(prompt, group.max_tokens, group.stream).to_string());
    let sent = Instant::now();
    let failed = |start: Instant| Answer {
        status: 0,
        code: None,
        work: 0,
        ttft: None,
        done_at: start.elapsed(),
    };
    let Ok(resp) = client.send(Method::POST, &url, &headers, Some(body)).await else {
        return failed(start);
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut ttft = None;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return failed(start);
        };
        if let Some(data) = frame.data_ref() {
            if ttft.is_none() && status == 200 && group.stream && !data.is_empty() {
                ttft = Some(sent.elapsed());
            }
            // Streams are long and only their timing counts here.
            if !group.stream || status != 200 {
                bytes.extend_from_slice(data);
            }
        }
    }
    let json = serde_json::from_slice::<Value>(&bytes).ok();
    let code = json
        .as_ref()
        .and_then(|v| v.pointer("/error/code")?.as_str().map(str::to_string));
    let usage = |name: &str| {
        json.as_ref()
            .and_then(|v| v.pointer(&format!("/usage/{name}"))?.as_u64())
            .unwrap_or(0)
    };
    Answer {
        status,
        code,
        work: usage("prompt_tokens") + usage("completion_tokens"),
        ttft,
        done_at: start.elapsed(),
    }
}

/// Token-work of the answers of 200 that ended within `[from, to)`.
pub fn work_between(answers: &[Answer], from: Duration, to: Duration) -> u64 {
    answers
        .iter()
        .filter(|a| a.status == 200 && a.done_at >= from && a.done_at < to)
        .map(|a| a.work)
        .sum()
}

/// Answers by status (and refusal code).
pub fn outcomes(answers: &[Answer]) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for a in answers {
        let key = match &a.code {
            Some(code) => format!("{} {code}", a.status),
            None => a.status.to_string(),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

/// The `q` quantile (0..=1) of the streams' TTFTs, if any.
pub fn ttft_quantile(answers: &[Answer], q: f64) -> Option<Duration> {
    let mut ttfts: Vec<Duration> = answers.iter().filter_map(|a| a.ttft).collect();
    if ttfts.is_empty() {
        return None;
    }
    ttfts.sort();
    let at = ((ttfts.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    Some(ttfts[at])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, work: u64, done_ms: u64, ttft_ms: Option<u64>) -> Answer {
        Answer {
            status,
            code: None,
            work,
            ttft: ttft_ms.map(Duration::from_millis),
            done_at: Duration::from_millis(done_ms),
        }
    }

    #[test]
    fn work_counts_only_answers_of_200_within_the_span() {
        let answers = [
            answer(200, 10, 500, None),
            answer(200, 20, 1500, None),
            answer(429, 40, 1500, None),
            answer(200, 80, 2500, None),
        ];
        let s = Duration::from_secs(1);
        assert_eq!(work_between(&answers, s, 2 * s), 20);
        assert_eq!(outcomes(&answers)["200"], 3);
    }

    #[test]
    fn quantiles_read_the_sorted_ttfts() {
        let answers: Vec<Answer> = (1..=100).map(|ms| answer(200, 0, 0, Some(ms))).collect();
        assert_eq!(
            ttft_quantile(&answers, 0.99),
            Some(Duration::from_millis(99))
        );
        assert_eq!(ttft_quantile(&answers, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(ttft_quantile(&[], 0.5), None);
    }
}
