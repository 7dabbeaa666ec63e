use super::*;

fn window(seconds: &[(u64, u64)], in_flight: u64) -> TenantWindow {
    // (requests, output tokens) per second, oldest first, a 10 s window
    // starting at second 100.
    let mut all = vec![Usage::default(); 10];
    for (i, (requests, output_tokens)) in seconds.iter().enumerate() {
        all[i] = Usage {
            requests: *requests,
            input_tokens: 0,
            output_tokens: *output_tokens,
        };
    }
    TenantWindow {
        first_sec: 100,
        seconds: all,
        in_flight,
    }
}

fn totals(w: &TenantWindow) -> TenantTotals {
    TenantTotals {
        used: w.total(),
        in_flight: w.in_flight,
    }
}

/// The check on `w`'s totals, and the refusal read from `w` if any.
fn judge(limits: &Limits, w: &TenantWindow, request: &Usage) -> Result<(), Breach> {
    check(limits, &totals(w), request).map_err(|e| breach(&e, w))
}

fn ask(output_tokens: u64) -> Usage {
    Usage {
        requests: 1,
        input_tokens: 0,
        output_tokens,
    }
}

#[test]
fn the_request_that_would_pass_the_allowance_is_refused_with_the_wait_until_room() {
    let limits = Limits {
        requests: Some(5),
        ..Limits::default()
    };
    // 2 requests in the oldest second, 2 in the third: 4 used.
    let w = window(&[(2, 0), (0, 0), (2, 0)], 0);
    assert_eq!(judge(&limits, &w, &ask(0)), Ok(()));
    let w = window(&[(2, 0), (0, 0), (3, 0)], 0);
    let breach = judge(&limits, &w, &ask(0)).unwrap_err();
    assert_eq!(breach.reason, Reason::RateLimited);
    // One request must leave: the oldest second leaves in 1 s.
    assert_eq!(breach.retry_after_secs, 1);
    let w = window(&[(0, 0), (0, 0), (5, 0)], 0);
    assert_eq!(judge(&limits, &w, &ask(0)).unwrap_err().retry_after_secs, 3);
    let mut newest = window(&[], 0);
    newest.seconds[9].requests = 5;
    assert_eq!(
        judge(&limits, &newest, &ask(0))
            .unwrap_err()
            .retry_after_secs,
        10,
        "all used this second: room again once the whole window passed"
    );
}

#[test]
fn token_allowances_count_the_requests_reservation() {
    let limits = Limits {
        output_tokens: Some(100),
        ..Limits::default()
    };
    let w = window(&[(9, 90)], 0);
    assert_eq!(judge(&limits, &w, &ask(10)), Ok(()));
    let breach = judge(&limits, &w, &ask(11)).unwrap_err();
    assert_eq!(breach.reason, Reason::TokensExhausted);
    assert_eq!(breach.reason.code(), "tenant_tokens_exhausted");
    let never = judge(&limits, &window(&[], 0), &ask(101)).unwrap_err();
    assert!(never.message.contains("can never fit"), "{}", never.message);
}

#[test]
fn concurrency_counts_the_fleets_in_flight_requests() {
    let limits = Limits {
        max_concurrent: Some(2),
        ..Limits::default()
    };
    assert_eq!(judge(&limits, &window(&[], 1), &ask(0)), Ok(()));
    let breach = judge(&limits, &window(&[], 2), &ask(0)).unwrap_err();
    assert_eq!(breach.reason, Reason::Concurrency);
    assert_eq!(breach.retry_after_secs, 1);
}

#[test]
fn headers_say_allowance_remaining_and_reset_for_each_configured_limit() {
    let limits = Limits {
        requests: Some(5),
        output_tokens: Some(100),
        input_tokens: Some(10),
        ..Limits::default()
    };
    // Used: 3 requests, 30 output tokens, no input tokens.
    let w = window(&[(1, 10), (0, 0), (2, 20)], 0);
    // Now: second 109.5, a 10 s window: this second's usage leaves at 119.
    let got = headers(&limits, &totals(&w), 10, 109_500_000);
    let text: Vec<(String, String)> = got
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let expect = [
        ("x-ratelimit-limit-requests", "5"),
        ("x-ratelimit-remaining-requests", "2"),
        ("x-ratelimit-reset-requests", "10s"),
        ("x-ratelimit-limit-input-tokens", "10"),
        ("x-ratelimit-remaining-input-tokens", "10"),
        ("x-ratelimit-reset-input-tokens", "0ms"),
        ("x-ratelimit-limit-output-tokens", "100"),
        ("x-ratelimit-remaining-output-tokens", "70"),
        ("x-ratelimit-reset-output-tokens", "10s"),
    ];
    assert_eq!(
        text,
        expect
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn durations_read_as_openai_writes_them() {
    assert_eq!(duration_text(0), "0ms");
    assert_eq!(duration_text(250_000), "250ms");
    assert_eq!(duration_text(1_000_000), "1s");
    assert_eq!(duration_text(1_000_001), "2s");
    assert_eq!(duration_text(59_000_000), "59s");
    assert_eq!(duration_text(360_000_000), "6m0s");
}
