//! When a failed attempt may be sent again: the one rule the proxy's
//! retries and the engine client's stale-connection resend both follow.
//!
//! Why a rule per method: a request is sent again only where the engine
//! provably did not start the work, or where starting it twice does no
//! harm. A `POST` (a generation, a stored response, an uploaded file, a
//! batch) that an engine received whole may be running there even if the
//! connection then broke, so sending it again could run it twice. What
//! the router can prove:
//!
//! - no connection was opened (refused, connect timeout, TLS handshake),
//!   or writing failed before the last byte: an engine cannot run a
//!   request whose body it did not get whole (the body is framed by
//!   `content-length`), so any method may go again;
//! - the engine answered 429 or 503: it refused the work, so any method
//!   may go again;
//! - anything after the whole request was written (the connection closed
//!   or reset before any answer byte, a broken answer head, no answer
//!   head within `--attempt-timeout-secs`, a 408/500/502/504 answer): the
//!   engine may have started, so only an idempotent method (RFC 9110
//!   §9.2.2: `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) goes
//!   again; for any other method the failure or the engine's answer is
//!   the client's.
//!
//! Every other status is the engine's answer and passes through. The
//! retry table in `docs/routing.md` ("Retries") is this function's table.

use http::{Method, StatusCode};

/// How far a failed attempt got, as far as the router can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The engine cannot have the whole request: the worker URL was
    /// unusable, the connection was never opened (refused, timed out, TLS
    /// handshake failed), or writing failed before the last byte.
    NotDelivered,
    /// The whole request was written, then the connection ended (closed,
    /// reset, read error) before any byte of an answer.
    DeliveredNoAnswer,
    /// Part of an answer arrived, but no usable response head (malformed,
    /// or the connection broke mid-head).
    BrokenAnswer,
    /// No response head within the attempt's deadline.
    NoHeadersInTime,
    /// The engine answered with this status.
    Answered(StatusCode),
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Safe to send again (elsewhere, or on a new connection).
    Retry,
    /// An idempotent request would be sent again, but this method may
    /// have had its effect at the engine: not sent again (counted).
    Unsafe,
    /// Nothing to retry: the answer is the engine's, for the client.
    Final,
}

/// Whether `method` is idempotent (RFC 9110 §9.2.2): sending it twice has
/// the effect of sending it once.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The rule: whether an attempt of `method` that got as far as `progress`
/// may be sent again.
pub fn verdict(method: &Method, progress: Progress) -> Verdict {
    let only_if_idempotent = || match is_idempotent(method) {
        true => Verdict::Retry,
        false => Verdict::Unsafe,
    };
    match progress {
        Progress::NotDelivered => Verdict::Retry,
        Progress::DeliveredNoAnswer | Progress::BrokenAnswer | Progress::NoHeadersInTime => {
            only_if_idempotent()
        }
        Progress::Answered(status) => match status.as_u16() {
            429 | 503 => Verdict::Retry,
            408 | 500 | 502 | 504 => only_if_idempotent(),
            _ => Verdict::Final,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDEMPOTENT: [Method; 6] = [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ];

    fn not_idempotent() -> Vec<Method> {
        vec![
            Method::POST,
            Method::PATCH,
            Method::CONNECT,
            Method::from_bytes(b"PROPFIND").unwrap(),
        ]
    }

    /// The table, row by row, for every method and every status code.
    #[test]
    fn the_table_for_every_method_and_status() {
        let transport = [
            (Progress::NotDelivered, Verdict::Retry, Verdict::Retry),
            (Progress::DeliveredNoAnswer, Verdict::Retry, Verdict::Unsafe),
            (Progress::BrokenAnswer, Verdict::Retry, Verdict::Unsafe),
            (Progress::NoHeadersInTime, Verdict::Retry, Verdict::Unsafe),
        ];
        for (progress, idempotent, other) in transport {
            for method in &IDEMPOTENT {
                assert_eq!(
                    verdict(method, progress),
                    idempotent,
                    "{method} {progress:?}"
                );
            }
            for method in &not_idempotent() {
                assert_eq!(verdict(method, progress), other, "{method} {progress:?}");
            }
        }
        for code in 100..=999u16 {
            let status = StatusCode::from_u16(code).unwrap();
            let (idempotent, other) = match code {
                429 | 503 => (Verdict::Retry, Verdict::Retry),
                408 | 500 | 502 | 504 => (Verdict::Retry, Verdict::Unsafe),
                _ => (Verdict::Final, Verdict::Final),
            };
            for method in &IDEMPOTENT {
                let got = verdict(method, Progress::Answered(status));
                assert_eq!(got, idempotent, "{method} {code}");
            }
            for method in &not_idempotent() {
                let got = verdict(method, Progress::Answered(status));
                assert_eq!(got, other, "{method} {code}");
            }
        }
    }

    #[test]
    fn post_is_never_sent_again_once_it_reached_the_engine() {
        for progress in [
            Progress::DeliveredNoAnswer,
            Progress::BrokenAnswer,
            Progress::NoHeadersInTime,
            Progress::Answered(StatusCode::INTERNAL_SERVER_ERROR),
            Progress::Answered(StatusCode::BAD_GATEWAY),
            Progress::Answered(StatusCode::GATEWAY_TIMEOUT),
            Progress::Answered(StatusCode::REQUEST_TIMEOUT),
        ] {
            assert_ne!(
                verdict(&Method::POST, progress),
                Verdict::Retry,
                "{progress:?}"
            );
        }
        assert_eq!(
            verdict(&Method::POST, Progress::NotDelivered),
            Verdict::Retry
        );
        assert_eq!(
            verdict(
                &Method::POST,
                Progress::Answered(StatusCode::TOO_MANY_REQUESTS)
            ),
            Verdict::Retry
        );
    }
}
