//! Load for the limit tests: requests offered at a fixed pace across the
//! replicas (the output-token tests' traffic shapes) and streams held open
//! (the concurrency test).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_tests::client::{HttpClient, SseStream};
use shoal_tests::workload::{chat, text, tokens_in};
use tokio::task::JoinSet;

use super::answer::{ask, rate_headers, refusal};
use super::{Rig, allowance};

/// What a paced offer got back.
#[derive(Debug, Default)]
pub struct Paced {
    /// Requests offered (each answered), what the admissions are weighed against.
    pub offered: usize,
    /// Requests answered 200, whose output tokens the tests count.
    pub admitted: usize,
    /// Refusals by error code (status and code).
    pub refused: BTreeMap<String, usize>,
    /// Per replica: (offered, admitted).
    pub per_replica: Vec<(usize, usize)>,
    /// When the last request was sent, from the first.
    last_sent: Duration,
    /// Answers neither 200 nor 429, and 429s that fail the checks.
    wrong: Vec<String>,
}

/// How requests pick a replica.
#[derive(Debug, Clone, Copy)]
pub enum Spread {
    /// Uniformly at random.
    Even,
    /// This share to replica 0, the rest uniformly over the others.
    Skewed(f64),
}

/// Offers requests of `max_tokens` output tokens from `key` at `rate` per
/// second for `span`, each to a replica picked by `spread` (seeded), each
/// without waiting for the ones before; checks every refusal (`code`) and
/// the `x-ratelimit-*-output-tokens` limit header (`limit`).
#[allow(clippy::too_many_arguments)]
pub async fn offer_paced(
    rig: &Rig,
    key: &'static str,
    rate: f64,
    span: Duration,
    spread: Spread,
    seed: u64,
    max_tokens: u64,
    (code, limit, window): (&'static str, u64, Duration),
) -> Paced {
    let urls = rig.urls();
    let n = urls.len();
    let mut rng = StdRng::seed_from_u64(seed);
    let count = (rate * span.as_secs_f64()).round() as usize;
    let mut out = Paced {
        per_replica: vec![(0, 0); n],
        ..Paced::default()
    };
    let mut tasks = JoinSet::new();
    let start = tokio::time::Instant::now();
    for k in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate)).await;
        let r = match spread {
            Spread::Even => rng.random_range(0..n),
            Spread::Skewed(share) => {
                if n == 1 || rng.random_bool(share) {
                    0
                } else {
                    1 + rng.random_range(0..n - 1)
                }
            }
        };
        out.last_sent = start.elapsed();
        let (client, base) = (rig.client.clone(), urls[r].clone());
        let content = text(seed * 100_000 + k as u64, 64);
        tasks.spawn(async move {
            (
                r,
                ask(&client, &base, Some(key), &content, max_tokens).await,
            )
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (r, a) = done.unwrap();
        out.offered += 1;
        out.per_replica[r].0 += 1;
        if let Err(e) = rate_headers(&a, "output-tokens", limit, window) {
            out.wrong.push(format!("replica {r}: {e}"));
        }
        match a.status {
            200 => {
                out.admitted += 1;
                out.per_replica[r].1 += 1;
            }
            429 => {
                *out.refused
                    .entry(a.error_field("code").unwrap_or_default())
                    .or_default() += 1;
                if let Err(e) = refusal(&a, code, window.as_secs()) {
                    out.wrong.push(format!("replica {r}: {e}"));
                }
            }
            _ => out.wrong.push(format!("replica {r}: {}", a.brief())),
        }
    }
    out
}

/// The window of the token tests, short so that a test can fill it.
pub const TOKENS_WINDOW_SECS: u64 = 6;
/// 1000 output tokens per 6 s window.
pub const OUTPUT_TPM: u64 = 10_000;
/// Output tokens each request of the token tests asks for (and gets).
pub const TOKENS_PER_REQUEST: u64 = 10;
/// Replicas of the token tests: enough that skewed traffic differs from even.
pub const TOKENS_REPLICAS: usize = 3;

/// The tenants file of the token tests: one tenant per traffic shape.
pub fn output_token_tenants() -> String {
    format!(
        "window_secs = {TOKENS_WINDOW_SECS}\n\
         [tenants.even]\nkeys = [\"even-key-00000001\"]\noutput_tokens_per_minute = {OUTPUT_TPM}\n\
         [tenants.skewed]\nkeys = [\"skewed-key-0000001\"]\noutput_tokens_per_minute = {OUTPUT_TPM}\n"
    )
}

/// Offers `key`'s traffic at `times` × its allowance rate, for a little
/// less than one window (so no admission can slide out of the window
/// while the offer lasts, whatever the window's granularity).
pub async fn offer_tokens(
    rig: &Rig,
    key: &'static str,
    times: f64,
    spread: Spread,
    seed: u64,
) -> Paced {
    let limit = allowance(OUTPUT_TPM, TOKENS_WINDOW_SECS);
    let window = Duration::from_secs(TOKENS_WINDOW_SECS);
    let requests_per_window = (limit / TOKENS_PER_REQUEST) as f64;
    let rate = times * requests_per_window / window.as_secs_f64();
    let span = window - Duration::from_secs(1);
    let p = offer_paced(
        rig,
        key,
        rate,
        span,
        spread,
        seed,
        TOKENS_PER_REQUEST,
        ("tenant_tokens_exhausted", limit, window),
    )
    .await;
    println!(
        "{key} {spread:?} at {rate:.1} req/s for {span:?} (last sent at {:?}): {} offered, \
         {} admitted = {} output tokens of {limit}; per replica (offered, admitted) {:?}; \
         refused {:?}",
        p.last_sent,
        p.offered,
        p.admitted,
        p.admitted as u64 * TOKENS_PER_REQUEST,
        p.per_replica,
        p.refused
    );
    assert!(
        p.wrong.is_empty(),
        "{} wrong answers, e.g. {:?}",
        p.wrong.len(),
        &p.wrong[..p.wrong.len().min(5)]
    );
    assert!(
        p.last_sent < window,
        "the offer ran {:?}, past the {window:?} window (the box is too slow to pace)",
        p.last_sent
    );
    p
}

/// A streamed chat request from a tenant that has produced its first
/// event.
pub struct Held {
    /// The open stream, read on by [`Held::finish`].
    stream: SseStream,
    /// Output tokens received so far.
    received: u64,
}

impl Held {
    /// Opens a stream of `max_tokens` through `base` with `key` and waits
    /// for its first event.
    pub async fn open(
        client: &HttpClient,
        base: &str,
        key: &str,
        content: &str,
        max_tokens: u64,
    ) -> Result<Self, String> {
        let url = format!("{base}/v1/chat/completions");
        let auth = format!("Bearer {key}");
        let mut stream = client
            .post_stream(
                &url,
                &chat(content, max_tokens, true),
                &[("authorization", auth.as_str())],
            )
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if stream.status != 200 {
            let first = stream.next_data().await.ok().flatten().unwrap_or_default();
            return Err(format!("{url} answered {}: {first}", stream.status));
        }
        match stream.next_data().await {
            Ok(Some(first)) => Ok(Self {
                received: tokens_in(&first),
                stream,
            }),
            Ok(None) => Err(format!("{url}: the stream ended before its first event")),
            Err(e) => Err(format!("{url}: {e}")),
        }
    }

    /// Reads to `[DONE]`; the output tokens received in all.
    pub async fn finish(mut self) -> Result<u64, String> {
        loop {
            match self.stream.next_data().await {
                Ok(Some(data)) if data == "[DONE]" => return Ok(self.received),
                Ok(Some(data)) => self.received += tokens_in(&data),
                Ok(None) => {
                    return Err(format!(
                        "the stream ended after {} tokens without [DONE]",
                        self.received
                    ));
                }
                Err(e) => return Err(format!("after {} tokens: {e}", self.received)),
            }
        }
    }
}
