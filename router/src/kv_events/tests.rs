use super::*;

fn fixture() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tokenizer/tokenizer.json")
}

fn with_fixture() -> KvEvents {
    KvEvents::new(KvEventsConfig {
        kv_tokenizer: vec![fixture().display().to_string()],
        ..KvEventsConfig::default()
    })
}

/// A long completion prompt (~6k tokens of the fixture).
fn long_prompt() -> String {
    let mut text = String::new();
    let mut i = 0u64;
    while text.len() < 24_000 {
        text.push_str(["alpha ", "bravo ", "charlie ", "delta ", "echo "][(i * 7 % 5) as usize]);
        text.push_str(&format!("w{i} "));
        i += 1;
    }
    text
}

/// The fixture's ids for `text`, from a tokenizer of its own (the
/// replica's would remember the text in its prefix cache).
fn ids_of(text: &str) -> Vec<u32> {
    Tokenizers::load(&[(None, fixture())], &[])
        .unwrap()
        .encode(None, text)
        .unwrap()
}

/// Stores `tokens`' full blocks as one engine's, under `lora`.
fn store(kv: &KvEvents, tokens: &[u32], lora: Option<&str>) {
    let size = kv.block_size();
    let blocks = tokens.len() / size;
    let mut index = kv.index.write().unwrap();
    let stream = index.add_stream(7);
    index.set_coverage(stream, Coverage::Complete);
    index.apply(
        stream,
        &[wire::KvEvent::Stored(wire::Stored {
            block_hashes: (0..blocks as u64).collect(),
            parent: None,
            token_ids: Some(tokens[..blocks * size].to_vec()),
            block_size: Some(size as u32),
            lora: lora.map(str::to_owned),
            on_gpu: true,
            main_group: true,
        })],
    );
}

fn completion(model: &str, prompt: &str) -> RequestInfo {
    let body = serde_json::json!({"model": model, "prompt": prompt}).to_string();
    crate::request::inspect(body.as_bytes(), Some(1 << 20)).unwrap()
}

#[test]
fn a_prompt_is_tokenized_only_as_deep_as_some_engine_holds_it() {
    let kv = with_fixture();
    let text = long_prompt();
    let ids = ids_of(&text);
    let all = chain::blocks(chain::seed(None), &ids, kv.block_size());
    // Nothing held: one segment is tokenized, then it stops.
    let cold = kv.prompt_blocks(&completion("m", &text)).unwrap();
    assert!(
        !cold.hashes.is_empty() && cold.hashes.len() < all.len() / 10,
        "{} of {}",
        cold.hashes.len(),
        all.len()
    );
    assert_eq!(cold.hashes[..], all[..cold.hashes.len()]);
    // The estimate of the whole prompt's tokens is close to the truth.
    let off = cold.tokens.abs_diff(ids.len()) as f64 / ids.len() as f64;
    assert!(off < 0.25, "estimated {} of {}", cold.tokens, ids.len());
    // An engine holding the first third: the blocks go past it by at
    // most a segment, and all of them are the whole prompt's.
    store(&kv, &ids[..ids.len() / 3], None);
    let warm = kv.prompt_blocks(&completion("m", &text)).unwrap();
    assert!(warm.hashes.len() > all.len() / 3 && warm.hashes.len() < all.len() / 2);
    assert_eq!(warm.hashes[..], all[..warm.hashes.len()]);
    let mut depth = IdMap::default();
    kv.cached_blocks(&warm.hashes, &mut depth);
    assert_eq!(depth.get(&7), Some(&(ids.len() / 3 / kv.block_size())));
    // Held whole: every block, the exact count, the same identity.
    store(&kv, &ids, None);
    let whole = kv.prompt_blocks(&completion("m", &text)).unwrap();
    assert_eq!(whole.hashes, all);
    assert_eq!(whole.tokens, ids.len());
    assert_eq!(whole.whole, cold.whole);
}

#[test]
fn replicas_that_tokenized_to_different_depths_give_one_prefix_one_share() {
    let text = long_prompt();
    let ids = ids_of(&text);
    let request = completion("m", &text);
    // Two replicas with one index (an engine holds the prompt's first
    // third); the first has seen the whole prompt before, so its prefix
    // cache hands it every token, while the second stops tokenizing a
    // segment past the held blocks.
    let (seen, fresh) = (with_fixture(), with_fixture());
    assert!(seen.tokenizers.encode(None, &text).is_some());
    for kv in [&seen, &fresh] {
        store(kv, &ids[..ids.len() / 3], None);
    }
    let deep = seen.prompt_blocks(&request).unwrap();
    let shallow = fresh.prompt_blocks(&request).unwrap();
    assert!(
        deep.hashes.len() > shallow.hashes.len(),
        "the scenario needs different depths: {} and {}",
        deep.hashes.len(),
        shallow.hashes.len()
    );
    let held = ids.len() / 3 / fresh.block_size();
    let mut depth = IdMap::default();
    fresh.cached_blocks(&shallow.hashes, &mut depth);
    assert_eq!(depth.get(&7), Some(&held));
    let size = fresh.block_size();
    let part = |b: &PromptBlocks| b.cached_part(held, size, request.prompt_tokens);
    assert_eq!(part(&deep), part(&shallow));
    // About a third of the prompt, and nothing for nothing cached.
    let third = request.prompt_tokens / 3;
    assert!(
        part(&deep).abs_diff(third) < third / 10,
        "{} of {}",
        part(&deep),
        request.prompt_tokens
    );
    assert_eq!(deep.cached_part(0, size, request.prompt_tokens), 0);
    // The engine's own ids: the share is of the ids.
    let mut with_ids = request.clone();
    with_ids.token_ids = Some(ids.clone().into());
    let exact = fresh.prompt_blocks(&with_ids).unwrap();
    assert!(exact.block_ends.is_empty());
    assert_eq!(
        exact.cached_part(held, size, 600),
        (held * size * 600 / ids.len()) as u64
    );
}

#[test]
fn an_adapters_requests_chain_from_its_own_seed_once_its_blocks_are_seen() {
    let kv = with_fixture();
    let text = long_prompt();
    let ids = ids_of(&text);
    store(&kv, &ids[..ids.len() / 4], Some("my-lora"));
    let mut depth = IdMap::default();
    let adapter = kv.prompt_blocks(&completion("my-lora", &text)).unwrap();
    kv.cached_blocks(&adapter.hashes, &mut depth);
    assert_eq!(depth.get(&7), Some(&(ids.len() / 4 / kv.block_size())));
    // The base model's requests do not match the adapter's blocks.
    let base = kv.prompt_blocks(&completion("base", &text)).unwrap();
    kv.cached_blocks(&base.hashes, &mut depth);
    assert!(depth.is_empty(), "{depth:?}");
}

#[test]
fn discovered_sockets_serve_a_worker_unless_a_flag_names_its_own() {
    use crate::workers::{KvEventSockets, Worker};
    let worker = Worker::new("http://10.0.0.7:8000".into(), Default::default());
    let kv = KvEvents::new(KvEventsConfig {
        kv_events_dp_ranks: 2,
        ..KvEventsConfig::default()
    });
    assert!(kv.endpoints_of(&worker).is_empty(), "nothing says where");
    worker.set_kv_event_sockets(Some(KvEventSockets {
        events: "tcp://10.0.0.7:5557".into(),
        replay: None,
    }));
    assert_eq!(
        kv.endpoints_of(&worker),
        vec![
            StreamEndpoints {
                events: "tcp://10.0.0.7:5557".into(),
                replay: None,
            },
            StreamEndpoints {
                events: "tcp://10.0.0.7:5558".into(),
                replay: None,
            },
        ]
    );
    let flagged = KvEvents::new(KvEventsConfig {
        kv_events_endpoint: vec![(
            "http://10.0.0.7:8000".into(),
            "tcp://10.0.0.7:7000".into(),
            None,
        )],
        ..KvEventsConfig::default()
    });
    assert_eq!(
        flagged.endpoints_of(&worker)[0].events,
        "tcp://10.0.0.7:7000"
    );
}

#[test]
fn endpoints_follow_the_worker_host_and_the_rank_offset() {
    let kv = KvEvents::new(KvEventsConfig {
        kv_events_port: Some(5557),
        kv_events_replay_port: Some(5600),
        kv_events_dp_ranks: 2,
        ..KvEventsConfig::default()
    });
    assert_eq!(
        kv.endpoints_for("http://engine-a:8000/v1"),
        vec![
            StreamEndpoints {
                events: "tcp://engine-a:5557".into(),
                replay: Some("tcp://engine-a:5600".into()),
            },
            StreamEndpoints {
                events: "tcp://engine-a:5558".into(),
                replay: Some("tcp://engine-a:5601".into()),
            },
        ]
    );
    assert_eq!(url_host("https://[::1]:8443"), Some("[::1]"));
    assert_eq!(url_host("nonsense"), None);
    let one = KvEvents::new(KvEventsConfig {
        kv_events_endpoint: vec![(
            "http://127.0.0.1:8001".into(),
            "tcp://127.0.0.1:7001".into(),
            None,
        )],
        ..KvEventsConfig::default()
    });
    assert_eq!(
        one.endpoints_for("http://127.0.0.1:8001"),
        vec![StreamEndpoints {
            events: "tcp://127.0.0.1:7001".into(),
            replay: None,
        }]
    );
    assert!(one.endpoints_for("http://127.0.0.1:8002").is_empty());
    let off = KvEvents::new(KvEventsConfig::default());
    assert!(off.endpoints_for("http://a:1").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_worker_is_subscribed_once_its_sockets_are_known_and_again_when_they_change() {
    use crate::workers::{KvEventSockets, Registry};
    let registry = Arc::new(Registry::new(
        &["http://10.0.0.9:8000".to_string()],
        Default::default(),
    ));
    let kv = Arc::new(KvEvents::new(KvEventsConfig::default()));
    let task = tokio::spawn(kv.clone().run(registry.clone()));
    let worker = registry.all()[0].clone();
    let streams = |kv: &KvEvents| kv.index().read().unwrap().streams_of(worker.id());
    // No sockets yet: nothing to follow, asked again every round.
    tokio::time::sleep(RECONCILE_EVERY * 2).await;
    assert!(streams(&kv).is_empty());
    let sockets = |port: u16| KvEventSockets {
        events: format!("tcp://127.0.0.1:{port}"),
        replay: None,
    };
    worker.set_kv_event_sockets(Some(sockets(1)));
    tokio::time::sleep(RECONCILE_EVERY * 2).await;
    let first = streams(&kv);
    assert_eq!(first.len(), 1);
    // Discovery names another port: the old stream goes, a new one comes.
    worker.set_kv_event_sockets(Some(sockets(2)));
    tokio::time::sleep(RECONCILE_EVERY * 2).await;
    let second = streams(&kv);
    assert_eq!(second.len(), 1);
    assert_ne!(first, second);
    task.abort();
}
