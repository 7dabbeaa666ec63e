//! The mock engine's model and routes over real HTTP on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{chat, start, text, wait_until};
use serde_json::{Value, json};
use shoal_tests::client::HttpClient;
use shoal_tests::mock::{EngineConfig, Flavor};

/// Fast-running engine: 1 ms wall steps at time-scale 10.
fn fast(flavor: Flavor) -> EngineConfig {
    EngineConfig {
        flavor,
        kv_capacity_tokens: 3_500,
        max_running: 16,
        prefill_tps: 20_000.0,
        decode_base_ms: 10.0,
        decode_per_req_ms: 0.0,
        time_scale: 10.0,
        tokens_per_chunk: 16,
        ..EngineConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_rises_queue_forms_and_finished_requests_free_kv() {
    let h = start(fast(Flavor::Sglang)).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/chat/completions", h.url());
    // 8 prompts of 1000 tokens; the KV cache (3500) holds three at once.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (c, u) = (client.clone(), url.clone());
            tokio::spawn(async move { c.post_json(&u, &chat(&text(i, 4000), 100, false)).await })
        })
        .collect();
    let (mut max_kv, mut max_running, mut max_waiting) = (0, 0, 0);
    let loads_url = format!("{}/v1/loads?include=core", h.url());
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let v = client.get(&loads_url).await.unwrap().json().unwrap();
        let l = &v["loads"][0];
        max_kv = max_kv.max(l["num_used_tokens"].as_u64().unwrap());
        max_running = max_running.max(l["num_running_reqs"].as_u64().unwrap());
        max_waiting = max_waiting.max(l["num_waiting_reqs"].as_u64().unwrap());
        assert!(l["token_usage"].as_f64().unwrap() <= 1.0);
        if tasks.iter().all(|t| t.is_finished()) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert!(max_kv >= 3_000, "KV usage rose: {max_kv}");
    assert!(max_kv <= 3_500);
    assert_eq!(max_running, 3, "KV capacity bounds the batch");
    assert!(max_waiting >= 4, "a queue formed: {max_waiting}");
    let mut queue_ms = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_eq!(r.status, 200);
        queue_ms.push(r.header("x-mock-queue-ms").unwrap().parse::<f64>().unwrap());
        let v = r.json().unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], 1000);
        assert_eq!(v["usage"]["completion_tokens"], 100);
    }
    queue_ms.sort_by(f64::total_cmp);
    assert!(
        queue_ms[7] > queue_ms[0] + 5.0,
        "later requests waited: {queue_ms:?}"
    );
    let s = h.snapshot();
    assert_eq!((s.kv_used_tokens, s.running, s.waiting), (0, 0, 0));
    assert_eq!(s.counters.requests_completed, 8);
    assert_eq!(s.counters.generation_tokens_total, 800);
    assert_eq!(s.counters.preemptions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_stream_frees_kv_and_kv_grows_per_token() {
    let cfg = EngineConfig {
        decode_base_ms: 20.0,
        time_scale: 1.0,
        tokens_per_chunk: 1,
        ..fast(Flavor::Vllm)
    };
    let h = start(cfg).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/chat/completions", h.url());
    let mut sse = client
        .post_stream(&url, &chat(&text(1, 400), 1000, true), &[])
        .await
        .unwrap();
    assert_eq!(sse.status, 200);
    let _first = sse.next_data().await.unwrap().unwrap();
    let _second = sse.next_data().await.unwrap().unwrap();
    let s = h.snapshot();
    assert_eq!(s.running, 1);
    let decoded = s.slots[0].as_ref().unwrap().n_decoded;
    assert!(decoded >= 2);
    assert_eq!(
        s.kv_used_tokens,
        100 + decoded,
        "prompt plus one token per generated token"
    );
    drop(sse);
    wait_until(Duration::from_secs(2), || h.snapshot().kv_used_tokens == 0).await;
    let s = h.snapshot();
    assert_eq!((s.running, s.counters.requests_aborted), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_when_decode_outgrows_kv() {
    // Two 400-token prompts fit (800 of 1000), but 2 x 300 output tokens do not.
    let cfg = EngineConfig {
        kv_capacity_tokens: 1_000,
        ..fast(Flavor::Vllm)
    };
    let h = start(cfg).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/completions", h.url());
    let tasks: Vec<_> = (0..2)
        .map(|i| {
            let (c, u) = (client.clone(), url.clone());
            let body = json!({"prompt": text(i + 10, 1600), "max_tokens": 300});
            tokio::spawn(async move { c.post_json(&u, &body).await.unwrap() })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json().unwrap()["usage"]["completion_tokens"], 300);
    }
    let s = h.snapshot();
    assert!(s.counters.preemptions >= 1);
    assert_eq!(s.kv_used_tokens, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_prefix_prefills_faster() {
    // 2000-token prompts at 2000 tok/s: 1 s of model prefill, 100 ms wall.
    let cfg = EngineConfig {
        prefill_tps: 2_000.0,
        prefill_chunk_tokens: 8_192,
        kv_capacity_tokens: 10_000,
        ..fast(Flavor::Sglang)
    };
    let h = start(cfg).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/chat/completions", h.url());
    let shared = text(7, 8000);
    let ttft = |r: &shoal_tests::client::HttpResponse| -> f64 {
        r.header("x-mock-ttft-ms").unwrap().parse().unwrap()
    };
    let miss = client
        .post_json(&url, &chat(&shared, 4, false))
        .await
        .unwrap();
    let again = format!("{shared} and a different question");
    let t0 = Instant::now();
    let mut sse = client
        .post_stream(&url, &chat(&again, 4, true), &[])
        .await
        .unwrap();
    sse.next_data().await.unwrap().unwrap();
    let client_ttft_hit = t0.elapsed();
    let hit = client
        .post_json(&url, &chat(&format!("{shared}?"), 4, false))
        .await
        .unwrap();
    assert_eq!(
        miss.json().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let cached = hit.json().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 1_984, "cached {cached}");
    let (t_miss, t_hit) = (ttft(&miss), ttft(&hit));
    assert!(t_miss >= 95.0, "miss TTFT {t_miss} ms");
    assert!(
        t_hit * 4.0 < t_miss,
        "hit TTFT {t_hit} ms vs miss {t_miss} ms"
    );
    // The hit's first streamed byte reaches the client before a miss's
    // modelled prefill alone would have ended: a ratio of two behaviours
    // of this run, not a wall-clock bound the host's speed decides.
    assert!(
        client_ttft_hit.as_secs_f64() * 1000.0 < t_miss,
        "streamed hit's first byte after {client_ttft_hit:?}, miss TTFT {t_miss} ms"
    );
    let v = client
        .get(&format!("{}/v1/loads", h.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert!(v["loads"][0]["cache_hit_rate"].as_f64().unwrap() > 0.5);
}

async fn read_stream(client: &HttpClient, url: &str, body: &Value) -> Vec<String> {
    let mut sse = client.post_stream(url, body, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    assert_eq!(sse.headers["content-type"], "text/event-stream");
    let mut events = Vec::new();
    while let Some(d) = sse.next_data().await.unwrap() {
        events.push(d);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_with_done_and_carry_usage_when_asked() {
    let h = start(EngineConfig {
        tokens_per_chunk: 3,
        ..fast(Flavor::Vllm)
    })
    .await;
    let client = HttpClient::new();
    let chat_url = format!("{}/v1/chat/completions", h.url());
    let mut body = chat("0123456789", 10, true);
    body["stream_options"] = json!({"include_usage": true});
    let ev = read_stream(&client, &chat_url, &body).await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 3, "ceil(10 / 4)");
    assert_eq!(usage["usage"]["completion_tokens"], 10);
    assert_eq!(usage["usage"]["total_tokens"], 13);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "tok ".repeat(10));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    // 1 + 3 + 3 + 3 tokens: the first alone, then tokens_per_chunk at most.
    let deltas = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert_eq!(deltas, 4);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );

    let ev = read_stream(&client, &chat_url, &chat("abc", 2, true)).await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    assert!(
        ev.iter().all(|e| !e.contains("\"usage\"")),
        "no usage unless asked"
    );

    let url = format!("{}/v1/completions", h.url());
    let body = json!({"prompt": "abcdefgh", "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}});
    let ev = read_stream(&client, &url, &body).await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens"], 2);

    let url = format!("{}/generate", h.url());
    let body =
        json!({"text": "abcdefgh", "sampling_params": {"max_new_tokens": 6}, "stream": true});
    let ev = read_stream(&client, &url, &body).await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(last["text"], "tok ".repeat(6));
    assert_eq!(last["meta_info"]["completion_tokens"], 6);
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");

    let r = client
        .post_json(
            &url,
            &json!({"text": "abcdefgh", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await
        .unwrap();
    let v = r.json().unwrap();
    assert_eq!(
        (
            v["text"].as_str().unwrap(),
            v["meta_info"]["prompt_tokens"].as_u64().unwrap()
        ),
        ("tok tok ", 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_models_health_and_stats() {
    let h = start(fast(Flavor::Llamacpp)).await;
    let client = HttpClient::new();
    for path in ["/v1/chat/completions", "/v1/completions", "/generate"] {
        let r = client
            .post_raw(&format!("{}{path}", h.url()), "{not json")
            .await
            .unwrap();
        assert_eq!(r.status, 400);
        let v = r.json().unwrap();
        for k in ["message", "type", "code"] {
            assert!(v["error"][k].is_string(), "{path}: {v}");
        }
    }
    let r = client
        .post_json(
            &format!("{}/v1/chat/completions", h.url()),
            &chat(&text(3, 20_000), 10, false),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json().unwrap()["error"]["code"],
        "context_length_exceeded"
    );
    let v = client
        .get(&format!("{}/v1/models", h.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        (v["object"].as_str(), v["data"][0]["object"].as_str()),
        (Some("list"), Some("model"))
    );
    let r = client.get(&format!("{}/health", h.url())).await.unwrap();
    assert_eq!(
        (r.status, r.json().unwrap()),
        (200, json!({"status": "ok"}))
    );

    let url = format!("{}/v1/chat/completions", h.url());
    let body = chat("hello", 3, true).to_string();
    let r = client
        .send(
            http::Method::POST,
            &url,
            &[("x-request-id", "bench-42")],
            Some(body.into()),
        )
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-mock-request-id"));
    http_body_util::BodyExt::collect(r.into_body())
        .await
        .unwrap();
    let v = client
        .get(&format!("{}/stats", h.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    let rec = v["recent"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["client_id"] == "bench-42")
        .unwrap()
        .clone();
    for k in ["queue_ms", "ttft_ms", "e2e_ms"] {
        assert!(rec[k].as_f64().unwrap() >= 0.0);
    }
    assert!(rec["ttft_ms"].as_f64() >= rec["queue_ms"].as_f64());
    assert_eq!(rec["output_tokens"], 3);
    assert_eq!(v["snapshot"]["counters"]["requests_rejected"], 4);
    let seq = rec["seq"].as_u64().unwrap();
    let v = client
        .get(&format!("{}/stats?since={seq}", h.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["recent"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_modes() {
    let h = start(fast(Flavor::Vllm)).await;
    let client = HttpClient::new();
    let (base, fault) = (h.url(), format!("{}/mock/fault", h.url()));
    let set = |mode: &str| json!({"mode": mode});
    let chat_url = format!("{base}/v1/chat/completions");

    assert_eq!(
        client.post_json(&fault, &set("fail")).await.unwrap().status,
        200
    );
    let r = client
        .post_json(&chat_url, &chat("x", 1, false))
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert!(r.json().unwrap()["error"]["message"].is_string());
    assert_eq!(
        client.get(&format!("{base}/health")).await.unwrap().status,
        503
    );

    client
        .post_json(&fault, &set("garbage_metrics"))
        .await
        .unwrap();
    let m = client.get(&format!("{base}/metrics")).await.unwrap().text();
    assert!(m.contains("NaN"));
    client.post_json(&fault, &set("none")).await.unwrap();
    assert_eq!(
        client
            .post_json(&chat_url, &chat("x", 1, false))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        client
            .post_json(&fault, &set("sideways"))
            .await
            .unwrap()
            .status,
        400
    );

    client.post_json(&fault, &set("hang")).await.unwrap();
    let hung = tokio::time::timeout(
        Duration::from_millis(300),
        client.get(&format!("{base}/health")),
    )
    .await;
    assert!(hung.is_err(), "hang mode never answers");
    assert_eq!(
        client.get(&format!("{base}/stats")).await.unwrap().status,
        200
    );

    client.post_json(&fault, &set("die")).await.unwrap();
    wait_until(Duration::from_secs(2), || {
        std::net::TcpStream::connect(h.addr()).is_err()
    })
    .await;

    let sg = start(EngineConfig {
        fail_rate: 1.0,
        ..fast(Flavor::Sglang)
    })
    .await;
    client
        .post_json(&format!("{}/mock/fault", sg.url()), &set("garbage_metrics"))
        .await
        .unwrap();
    let body = client
        .get(&format!("{}/v1/loads", sg.url()))
        .await
        .unwrap()
        .body;
    assert!(serde_json::from_slice::<Value>(&body).is_err());
    client
        .post_json(&format!("{}/mock/fault", sg.url()), &set("none"))
        .await
        .unwrap();
    for _ in 0..5 {
        let r = client
            .post_json(&format!("{}/generate", sg.url()), &json!({"text": "x"}))
            .await
            .unwrap();
        assert_eq!(r.status, 503);
    }
    assert_eq!(sg.snapshot().counters.requests_failed, 5);
}

#[tokio::test]
async fn cli_starts_many_engines_and_validates_flags() {
    let exe = env!("CARGO_BIN_EXE_mock-engine");
    let out = std::process::Command::new(exe)
        .args(["--decode-per-req-ms", "-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--decode-per-req-ms"));
    let out = std::process::Command::new(exe)
        .args(["--time-scale", "inf"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--time-scale"));

    let mut child = tokio::process::Command::new(exe)
        .args(["--engines", "3", "--base-port", "0", "--flavor", "llamacpp"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let client = HttpClient::new();
    for _ in 0..3 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let url = line
            .strip_prefix("mock-engine listening on ")
            .unwrap()
            .strip_suffix(" flavor=llamacpp")
            .unwrap();
        assert!(url.starts_with("http://127.0.0.1:"));
        let slots = client
            .get(&format!("{url}/slots"))
            .await
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(slots.as_array().unwrap().len(), 64);
    }
    child.kill().await.unwrap();
}

#[tokio::test]
async fn load_endpoint_hits_are_counted() {
    let client = HttpClient::new();
    for (flavor, load_paths) in [
        (
            Flavor::Sglang,
            &["/v1/loads?include=core", "/get_load", "/metrics"][..],
        ),
        (Flavor::Vllm, &["/metrics"][..]),
        (Flavor::Llamacpp, &["/metrics", "/slots"][..]),
    ] {
        let h = start(fast(flavor)).await;
        for path in load_paths
            .iter()
            .chain(&["/health", "/v1/models", "/stats"])
        {
            let r = client.get(&format!("{}{path}", h.url())).await.unwrap();
            assert_eq!(r.status, 200, "{flavor} {path}");
        }
        assert_eq!(h.load_polls(), load_paths.len() as u64, "{flavor}");
        let v = client
            .get(&format!("{}/stats", h.url()))
            .await
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(v["load_polls"], load_paths.len() as u64, "{flavor}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_embeddings_answer_in_the_openai_shapes() {
    let h = start(fast(Flavor::Vllm)).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/responses", h.url());
    let messages =
        json!([{"role": "user", "content": [{"type": "input_text", "text": "abcdefgh"}]}]);
    let r = client
        .post_json(
            &url,
            &json!({"model": "m", "input": messages, "max_output_tokens": 3}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("completed"))
    );
    assert_eq!(v["output"][0]["content"][0]["text"], "tok tok tok ");
    assert_eq!(
        (
            v["usage"]["input_tokens"].as_u64(),
            v["usage"]["output_tokens"].as_u64()
        ),
        (Some(2), Some(3))
    );

    let events = read_stream(
        &client,
        &url,
        &json!({"input": "hi", "max_output_tokens": 2, "stream": true}),
    )
    .await;
    let types: Vec<String> = events
        .iter()
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).ok()?["type"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(types.first().map(String::as_str), Some("response.created"));
    assert_eq!(types.last().map(String::as_str), Some("response.completed"));
    assert!(types.iter().any(|t| t == "response.output_text.delta"));

    let url = format!("{}/v1/embeddings", h.url());
    let r = client
        .post_json(&url, &json!({"model": "m", "input": "hello there"}))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["data"][0]["embedding"].as_array().map(Vec::len), Some(8));
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    let again = client
        .post_json(&url, &json!({"input": "hello there"}))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        again["data"][0]["embedding"], v["data"][0]["embedding"],
        "deterministic"
    );
    let streamed = client
        .post_json(&url, &json!({"input": "x", "stream": true}))
        .await
        .unwrap();
    assert_eq!(streamed.status, 400, "embeddings do not stream");
}
