//! Each flavor's load endpoints: the ENGINES.md shapes field by field, the
//! numbers against the model state, and the router's own parsers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{
    chat, consistent, get, has_type, keys, sample, samples, sorted, start, text, wait_until,
};
use serde_json::Value;
use shoal_tests::client::HttpClient;
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, ModelSnapshot};

/// An engine with slow (250 ms) steps, two running requests (one of them
/// decoding), one queued request that shares a cached prefix, and a
/// non-zero generation counter: a state that holds still between polls.
async fn busy_engine(flavor: Flavor) -> (EngineHandle, HttpClient) {
    let cfg = EngineConfig {
        flavor,
        kv_capacity_tokens: 4_096,
        max_running: 2,
        prefill_tps: 1_000_000.0,
        decode_base_ms: 250.0,
        decode_per_req_ms: 0.0,
        time_scale: 1.0,
        tokens_per_chunk: 1,
        ..EngineConfig::default()
    };
    let h = start(cfg).await;
    let client = HttpClient::new();
    let url = format!("{}/v1/chat/completions", h.url());
    let shared = text(1, 1600);
    let prompts = [
        shared.clone(),
        text(2, 1200),
        format!("{shared}{}", text(3, 400)),
    ];
    for (i, p) in prompts.into_iter().enumerate() {
        let (c, u) = (client.clone(), url.clone());
        tokio::spawn(async move { c.post_json(&u, &chat(&p, 50, false)).await });
        if i == 0 {
            // Let the first request in alone so its prefix is cached.
            wait_until(Duration::from_secs(2), || {
                h.snapshot().counters.generation_tokens_total >= 1
            })
            .await;
        } else {
            let n = i as u64 + 1;
            wait_until(Duration::from_secs(2), || {
                h.snapshot().counters.requests_total == n
            })
            .await;
        }
    }
    wait_until(Duration::from_secs(2), || {
        let s = h.snapshot();
        s.running == 2 && s.waiting == 1 && s.counters.generation_tokens_total >= 3
    })
    .await;
    (h, client)
}

fn check_busy(s: &ModelSnapshot) {
    assert_eq!((s.running, s.waiting), (2, 1));
    assert!(
        s.kv_used_tokens >= 700 && s.kv_used_tokens < 1_000,
        "{}",
        s.kv_used_tokens
    );
    assert_eq!(s.waiting_tokens, 500);
    assert_eq!(
        s.waiting_uncached_tokens, 100,
        "400 prompt tokens are cached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_endpoints_match_engines_md_and_the_model() {
    let (h, client) = busy_engine(Flavor::Sglang).await;
    let (s, r) = consistent(&h, || {
        get(&client, format!("{}/v1/loads?include=core", h.url()))
    })
    .await;
    check_busy(&s);
    assert_eq!(r.status, 200);
    let v = r.json().unwrap();
    assert_eq!(
        keys(&v),
        sorted(&[
            "timestamp",
            "version",
            "accelerator",
            "num_accelerators",
            "loads"
        ])
    );
    let ts = v["timestamp"].as_str().unwrap();
    assert!(
        ts.len() == 32 && ts.ends_with("+00:00") && &ts[10..11] == "T",
        "{ts}"
    );
    let l = &v["loads"][0];
    assert_eq!(v["loads"].as_array().unwrap().len(), 1);
    let want = [
        "dp_rank",
        "num_running_reqs",
        "num_waiting_reqs",
        "num_waiting_uncached_tokens",
        "num_used_tokens",
        "num_total_tokens",
        "max_total_num_tokens",
        "max_running_requests",
        "token_usage",
        "gen_throughput",
        "cache_hit_rate",
        "utilization",
    ];
    assert_eq!(keys(l), sorted(&want));
    assert_eq!(l["dp_rank"], 0);
    assert_eq!(l["num_running_reqs"], 2);
    assert_eq!(l["num_waiting_reqs"], 1);
    assert_eq!(l["num_waiting_uncached_tokens"], s.waiting_uncached_tokens);
    assert_eq!(l["num_used_tokens"], s.kv_used_tokens);
    assert_eq!(l["num_total_tokens"], s.total_tokens());
    assert_eq!(l["max_total_num_tokens"], 4_096);
    assert_eq!(l["max_running_requests"], 2);
    assert_eq!(
        l["token_usage"].as_f64().unwrap(),
        s.kv_used_tokens as f64 / 4096.0
    );
    assert!(l["gen_throughput"].as_f64().unwrap() > 0.0);
    assert_eq!(l["cache_hit_rate"].as_f64().unwrap(), s.cache_hit_rate);

    for (q, status) in [
        ("", 200),
        ("?include=core,memory", 200),
        ("?include=all", 200),
        ("?include=nope", 400),
    ] {
        let r = client
            .get(&format!("{}/v1/loads{q}", h.url()))
            .await
            .unwrap();
        assert_eq!(r.status, status, "{q}");
    }

    let (s, r) = consistent(&h, || get(&client, format!("{}/get_load", h.url()))).await;
    let v = r.json().unwrap();
    let e = &v.as_array().unwrap()[0];
    let want = [
        "dp_rank",
        "num_reqs",
        "num_waiting_reqs",
        "num_tokens",
        "num_pending_tokens",
        "ts_tic",
    ];
    assert_eq!(keys(e), sorted(&want));
    assert_eq!(e["num_reqs"], 3);
    assert_eq!(e["num_waiting_reqs"], 1);
    assert_eq!(e["num_tokens"], s.total_tokens());
    assert_eq!(e["num_pending_tokens"], 500);
    assert!(e["ts_tic"].as_f64().unwrap() > 0.0);

    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    let m = r.text();
    let labels = r#"{engine_type="unified",model_name="mock/Qwen3-8B",moe_ep_rank="0",pp_rank="0",tp_rank="0"}"#;
    assert_eq!(
        samples(&m, "sglang:num_running_reqs"),
        vec![(labels.to_string(), "2.0".to_string())]
    );
    assert!(has_type(&m, "sglang:num_running_reqs", "gauge"));
    assert!(has_type(&m, "sglang:token_usage", "gauge"));
    assert_eq!(sample(&m, "sglang:num_queue_reqs"), 1.0);
    assert_eq!(sample(&m, "sglang:token_usage"), s.token_usage());
    assert!(sample(&m, "sglang:gen_throughput") > 0.0);
    assert_eq!(
        r.header("content-type")
            .map(|c| c.starts_with("text/plain")),
        Some(true)
    );
    assert_eq!(
        client
            .get(&format!("{}/health", h.url()))
            .await
            .unwrap()
            .body
            .len(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_metrics_match_engines_md_and_the_model() {
    let (h, client) = busy_engine(Flavor::Vllm).await;
    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    check_busy(&s);
    let m = r.text();
    let labels = r#"{engine="0",model_name="mock/Qwen3-8B"}"#.to_string();
    assert_eq!(
        samples(&m, "vllm:num_requests_running"),
        vec![(labels.clone(), "2.0".to_string())]
    );
    assert_eq!(
        samples(&m, "vllm:num_requests_waiting"),
        vec![(labels.clone(), "1.0".to_string())]
    );
    assert_eq!(sample(&m, "vllm:kv_cache_usage_perc"), s.token_usage());
    let generated = samples(&m, "vllm:generation_tokens_total");
    assert_eq!(generated[0].0, labels);
    assert_eq!(
        generated[0].1,
        format!("{}.0", s.counters.generation_tokens_total)
    );
    assert!(has_type(&m, "vllm:generation_tokens_total", "counter"));
    assert!(has_type(&m, "vllm:kv_cache_usage_perc", "gauge"));
    let created = &samples(&m, "vllm:generation_tokens_created")[0].1;
    assert!(
        created.contains("e+09"),
        "prometheus_client exponent form: {created}"
    );
    assert!(
        client
            .get(&format!("{}/v1/loads", h.url()))
            .await
            .unwrap()
            .status
            == 404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_endpoints_match_engines_md_and_the_model() {
    let (h, client) = busy_engine(Flavor::Llamacpp).await;
    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    check_busy(&s);
    let m = r.text();
    for name in [
        "prompt_tokens_total",
        "tokens_predicted_total",
        "tokens_predicted_seconds_total",
        "n_decode_total",
        "prompt_tokens_seconds",
        "predicted_tokens_seconds",
        "requests_processing",
        "requests_deferred",
        "n_busy_slots_per_decode",
    ] {
        let got = samples(&m, &format!("llamacpp:{name}"));
        assert_eq!(got.len(), 1, "{name}");
        assert_eq!(got[0].0, "", "no labels");
    }
    assert_eq!(samples(&m, "llamacpp:requests_processing")[0].1, "2");
    assert_eq!(sample(&m, "llamacpp:requests_deferred"), 1.0);
    assert_eq!(
        sample(&m, "llamacpp:tokens_predicted_total"),
        s.counters.generation_tokens_total as f64
    );
    assert_eq!(
        sample(&m, "llamacpp:n_decode_total"),
        s.counters.steps_total as f64
    );

    let (s, r) = consistent(&h, || get(&client, format!("{}/slots", h.url()))).await;
    let v = r.json().unwrap();
    let slots = v.as_array().unwrap();
    assert_eq!(slots.len(), 2);
    let busy_keys = [
        "id",
        "n_ctx",
        "speculative",
        "is_processing",
        "id_task",
        "n_prompt_tokens",
        "n_prompt_tokens_processed",
        "n_prompt_tokens_cache",
        "params",
        "next_token",
    ];
    let (mut used, mut ctx) = (0, 0);
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(slot["id"], i);
        assert_eq!(slot["n_ctx"], 2_048);
        assert_eq!(slot["is_processing"], true);
        assert_eq!(keys(slot), sorted(&busy_keys));
        let next = &slot["next_token"][0];
        assert_eq!(
            keys(next),
            sorted(&["has_next_token", "has_new_line", "n_remain", "n_decoded"])
        );
        assert_eq!(
            next["n_remain"].as_u64().unwrap() + next["n_decoded"].as_u64().unwrap(),
            50
        );
        assert_eq!(slot["params"]["n_predict"], 50);
        used += slot["n_prompt_tokens"].as_u64().unwrap() + next["n_decoded"].as_u64().unwrap();
        ctx += slot["n_ctx"].as_u64().unwrap();
    }
    assert_eq!(used, s.kv_used_tokens);
    assert_eq!(ctx, 4_096);
    let health = client
        .get(&format!("{}/health", h.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(health["status"], "ok");

    // An idle engine's slot carries only the first four fields.
    let idle = start(EngineConfig {
        flavor: Flavor::Llamacpp,
        max_running: 3,
        ..EngineConfig::default()
    })
    .await;
    let v: Value = client
        .get(&format!("{}/slots", idle.url()))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        keys(&v[2]),
        sorted(&["id", "n_ctx", "speculative", "is_processing"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_parsers_read_live_bodies_as_the_model_state() {
    use shoal::engines::{llamacpp, sglang, vllm};

    let (h, client) = busy_engine(Flavor::Sglang).await;
    let (s, r) = consistent(&h, || {
        get(&client, format!("{}/v1/loads?include=core", h.url()))
    })
    .await;
    let load = sglang::parse_loads(&r.body).unwrap();
    assert_eq!(load.token_usage, Some(s.token_usage()));
    assert_eq!(load.running_requests, Some(s.running as u64));
    assert_eq!(load.waiting_requests, Some(s.waiting as u64));
    assert_eq!(load.queued_tokens, Some(s.waiting_uncached_tokens));
    let tput = load.gen_throughput.unwrap();
    assert!(
        (tput - s.gen_throughput).abs() <= s.gen_throughput * 0.5,
        "{tput} vs {}",
        s.gen_throughput
    );
    let (s, r) = consistent(&h, || get(&client, format!("{}/get_load", h.url()))).await;
    let load = sglang::parse_get_load(&r.body).unwrap();
    assert_eq!(load.running_requests, Some(s.running as u64));
    assert_eq!(load.waiting_requests, Some(s.waiting as u64));
    assert_eq!(load.queued_tokens, Some(s.waiting_tokens));
    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    let load = sglang::parse_metrics(&r.text()).unwrap();
    assert_eq!(load.token_usage, Some(s.token_usage()));
    assert_eq!(
        (load.running_requests, load.waiting_requests),
        (Some(2), Some(1))
    );
    assert!(load.gen_throughput.unwrap() > 0.0);

    let (h, client) = busy_engine(Flavor::Vllm).await;
    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    let m = vllm::parse_metrics(&r.text()).unwrap();
    assert_eq!(m.load.token_usage, Some(s.token_usage()));
    assert_eq!(
        (m.load.running_requests, m.load.waiting_requests),
        (Some(2), Some(1))
    );
    assert_eq!(
        m.generation_tokens_total,
        Some(s.counters.generation_tokens_total as f64)
    );

    let (h, client) = busy_engine(Flavor::Llamacpp).await;
    let (s, r) = consistent(&h, || get(&client, format!("{}/metrics", h.url()))).await;
    let m = llamacpp::parse_metrics(&r.text()).unwrap();
    assert_eq!(
        (m.load.running_requests, m.load.waiting_requests),
        (Some(2), Some(1))
    );
    assert_eq!(
        m.tokens_predicted_total,
        Some(s.counters.generation_tokens_total as f64)
    );
    let (s, r) = consistent(&h, || get(&client, format!("{}/slots", h.url()))).await;
    assert_eq!(
        llamacpp::parse_slots(&r.body).unwrap(),
        Some(s.token_usage())
    );

    // Garbage mode: the parsers refuse the bodies or find no usable number.
    let fault = serde_json::json!({"mode": "garbage_metrics"});
    client
        .post_json(&format!("{}/mock/fault", h.url()), &fault)
        .await
        .unwrap();
    let slots = client.get(&format!("{}/slots", h.url())).await.unwrap();
    assert!(llamacpp::parse_slots(&slots.body).is_err());
    let text = client
        .get(&format!("{}/metrics", h.url()))
        .await
        .unwrap()
        .text();
    if let Ok(m) = llamacpp::parse_metrics(&text) {
        assert!(m.load.running_requests.is_none() && m.tokens_predicted_total.is_none());
    }
}
