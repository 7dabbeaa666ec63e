//! The one place every default lives.
//!
//! The clap flags, the `SHOAL_*` environment variables, the TOML config file
//! and the flag reference in `docs/configuration.md` all read these
//! constants, so a default is changed here and nowhere else.

/// Address the HTTP front binds to.
pub const HOST: &str = "0.0.0.0";
/// Port the HTTP front listens on.
pub const PORT: u16 = 30000;
/// Threads serving client connections; 0 = one per available core.
pub const IO_THREADS: usize = 0;
/// Upper bound on `--io-threads` (a typo guard, far above any core count).
pub const MAX_IO_THREADS: usize = 1024;
/// Routing policy used when `--policy` is not given.
pub const POLICY: &str = "prefix_affinity";

/// `cache_aware`: a prefix match above this fraction of the prompt routes by
/// affinity (SGLang gateway default).
pub const CACHE_THRESHOLD: f64 = 0.3;
/// `cache_aware`: in-flight request spread (max - min) that, together with
/// the relative test, marks the pool imbalanced.
pub const BALANCE_ABS_THRESHOLD: u64 = 64;
/// `cache_aware`: the pool is imbalanced only if max > this × min in-flight.
pub const BALANCE_REL_THRESHOLD: f64 = 1.5;
/// `cache_aware`: KV-usage spread (max k - min k) that marks the pool
/// imbalanced; 1.0 never fires.
pub const BALANCE_TOKEN_USAGE_THRESHOLD: f64 = 1.0;
/// `cache_aware`: any worker above this KV usage marks the pool
/// imbalanced; 1.0 never fires.
pub const OVERLOAD_TOKEN_USAGE_THRESHOLD: f64 = 1.0;
/// `cache_aware`: bytes of prompt text the prefix tree remembers per worker
/// (2^26, the SGLang gateway's `max_tree_size`).
pub const MAX_TREE_SIZE: usize = 1 << 26;
/// `cache_aware`: seconds between prefix-tree evictions (SGLang gateway).
pub const EVICTION_INTERVAL_SECS: u64 = 60;
/// `least_load`: weight `w` (seconds) of the KV barrier `w * k/(1-k)`.
pub const LEAST_LOAD_KV_PRESSURE_WEIGHT: f64 = 0.15;
/// `least_load`: tokens/s assumed for an engine that reports no throughput.
pub const LEAST_LOAD_DEFAULT_THROUGHPUT: f64 = 2000.0;
/// `least_load`: tokens/s an engine is credited with at least. SGLang's
/// `gen_throughput` and vLLM's generation throughput are the recent decode
/// rate: an engine decoding one short answer reports a few tokens/s and
/// would look minutes deep in work it clears in a second. A tenth of the
/// default keeps reports ordering busy engines while an idle one never
/// looks slower than this. Measured in tests/BENCHMARKS.md.
pub const LEAST_LOAD_MIN_THROUGHPUT: f64 = 200.0;
/// `least_load`: token-work booked for a request without a token estimate.
pub const LEAST_LOAD_MEAN_PREFILL_TOKENS: u64 = 1024;
/// `load_aware`: waiting-queue length at which a worker scores 0.
pub const LOAD_AWARE_THRESHOLD: u64 = 128;
/// `prefix_affinity`: leading 64-byte blocks of the prompt hashed into its
/// affinity key (1 KiB, ~256 tokens: past most chat-template openings,
/// short enough that turns of one conversation share it).
pub const PREFIX_AFFINITY_BLOCKS: usize = 16;
/// `prefix_affinity`: a worker keeps a prompt's affinity while its wait is
/// at most (1 + this) × the candidates' mean wait plus the request itself
/// (Mirrokni–Thorup–Zadimoghaddam's bounded loads; 0.25 as in HAProxy's
/// `hash-balance-factor 125`).
pub const PREFIX_AFFINITY_EPSILON: f64 = 0.25;

/// How often every engine's load endpoint is polled.
pub const LOAD_POLL_INTERVAL_MS: u64 = 1000;
/// A snapshot older than this many poll intervals counts as missing.
pub const LOAD_STALE_AFTER_POLLS: u64 = 3;
/// Which load format to poll engines with.
pub const WORKER_LOAD_SOURCE: &str = "auto";
/// Largest load-endpoint response body the monitor reads.
pub const LOAD_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Largest request body accepted (64 MiB leaves room for inline images).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Request-body bytes held at once over all requests; 0 = derived from the
/// memory limit (see [`BUFFERED_REQUEST_MEMORY_SHARE`]).
pub const MAX_BUFFERED_REQUEST_BYTES: usize = 0;
/// With `--max-buffered-request-bytes 0`, bodies may hold 1/this of the
/// memory limit (a quarter: with the prompt text a policy copies and the
/// engine's answer, a full budget stays well under half the limit).
pub const BUFFERED_REQUEST_MEMORY_SHARE: u64 = 4;
/// Deadline for a whole proxied request, streaming included.
pub const REQUEST_TIMEOUT_SECS: u64 = 1800;
/// Deadline for opening a TCP connection to a worker.
pub const CONNECT_TIMEOUT_MS: u64 = 3000;
/// Deadline for one attempt's response headers: a worker that accepts and
/// never answers is left for another after this. Streams answer headers at
/// once; a non-streamed completion answers when it is done, so this must
/// exceed the longest one (3 minutes: ~5,000 tokens at 30 tokens/s).
pub const ATTEMPT_TIMEOUT_SECS: u64 = 180;
/// Stored objects (responses, files, batches) whose engine a replica
/// remembers: the newest this many (about 10 MiB when full; an object
/// forgotten is located by asking the workers).
pub const STORED_OBJECTS_CAPACITY: usize = 65_536;

/// Inference requests proxied at once per replica; 0 = no limit (the router
/// cannot know what its engines hold, so admission is opt-in).
pub const MAX_CONCURRENT_REQUESTS: usize = 0;
/// Requests that may wait for a slot once the limit is reached (SGLang
/// gateway default); beyond it, 429.
pub const QUEUE_SIZE: usize = 100;
/// Seconds a queued request waits for a slot before 503 (SGLang gateway
/// default).
pub const QUEUE_TIMEOUT_SECS: u64 = 60;
/// Seconds a queued critical request waits for a slot: as long as a
/// standard one (it is served first, so it rarely waits at all).
pub const CRITICAL_QUEUE_TIMEOUT_SECS: u64 = 60;
/// Seconds a queued sheddable request waits for a slot: batch clients
/// retry, so a short wait frees the queue sooner for the classes above.
pub const SHEDDABLE_QUEUE_TIMEOUT_SECS: u64 = 10;
/// Fleet-wide in-flight requests per worker at which sheddable requests
/// are shed with 429 when every worker is there; 0 = off.
pub const SHEDDABLE_MAX_INFLIGHT: u64 = 0;
/// Fair share between tenants is measured across the fleet.
pub const FAIR_SHARE_SCOPE: super::FairShareScope = super::FairShareScope::Fleet;
/// Fleet-wide in-flight requests per worker above which a request is shed
/// with 503 when every worker is there; 0 = off.
pub const WORKER_MAX_INFLIGHT: u64 = 0;

/// Attempts after the first one, each on a freshly selected worker.
pub const RETRY_MAX_RETRIES: u32 = 5;
/// Backoff before the first retry.
pub const RETRY_INITIAL_BACKOFF_MS: u64 = 50;
/// Ceiling on the backoff between retries.
pub const RETRY_MAX_BACKOFF_MS: u64 = 30_000;
/// Growth factor of the backoff per retry.
pub const RETRY_BACKOFF_MULTIPLIER: f64 = 1.5;
/// Random spread applied to each backoff (0.2 = ±20 %).
pub const RETRY_JITTER_FACTOR: f64 = 0.2;
/// Prompt tokens below which a request skips the prefill pool (0 =
/// always disaggregate, as llm-d's default).
pub const PD_MIN_PROMPT_TOKENS: u64 = 0;
/// SGLang's default `--disaggregation-bootstrap-port`.
pub const PD_BOOTSTRAP_PORT: u16 = 8998;
/// Continuations one broken stream may start (0 = migration off): off by
/// default, because a continuation re-runs the prompt's prefill.
pub const MIGRATION_LIMIT: u32 = 0;
/// Generated text (JSON-escaped bytes) a migratable stream keeps: 1 MiB,
/// about 250k tokens of English, so only runaway streams outgrow it.
pub const MIGRATION_MAX_TEXT_BYTES: usize = 1 << 20;

/// Consecutive failures within the window that open a worker's circuit.
pub const CB_FAILURE_THRESHOLD: u32 = 10;
/// Consecutive successes in half-open state that close the circuit again.
pub const CB_SUCCESS_THRESHOLD: u32 = 3;
/// How long an open circuit rejects traffic before a half-open probe.
pub const CB_TIMEOUT_DURATION_SECS: u64 = 60;
/// Failures older than this no longer count towards opening the circuit.
pub const CB_WINDOW_DURATION_SECS: u64 = 120;

/// Seconds between active health checks of each worker.
pub const HEALTH_CHECK_INTERVAL_SECS: u64 = 10;
/// Deadline for one health check.
pub const HEALTH_CHECK_TIMEOUT_SECS: u64 = 5;
/// Consecutive failed checks that take a worker out of rotation.
pub const HEALTH_FAILURE_THRESHOLD: u32 = 3;
/// Consecutive passed checks that put it back.
pub const HEALTH_SUCCESS_THRESHOLD: u32 = 2;
/// Path probed on each worker.
pub const HEALTH_CHECK_ENDPOINT: &str = "/health";

/// Log filter used when `RUST_LOG` is not set.
pub const LOG_LEVEL: &str = "info";
/// Node name when neither `--mesh-name` nor the host name is available.
pub const MESH_NAME_FALLBACK: &str = "shoal";
/// Gossip (chitchat, UDP) port when the mesh is on and `--mesh-port` is not given.
pub const MESH_PORT: u16 = 30001;
/// QUIC load-plane (UDP) port when `--mesh-quic-port` is not given.
pub const MESH_QUIC_PORT: u16 = 30002;
/// Address the mesh sockets bind to.
pub const MESH_HOST: &str = "0.0.0.0";
/// Cluster id; replicas of another cluster are refused.
pub const MESH_CLUSTER_ID: &str = "shoal";
/// How often changed in-flight counts are pushed to peers (the mesh
/// crate's default).
pub const MESH_SYNC_INTERVAL_MS: u64 = shoal_mesh::DEFAULT_SYNC_INTERVAL_MS;
/// Shortest gap between two pushes made on change (the mesh crate's default).
pub const MESH_PUSH_MIN_GAP_MS: u64 = shoal_mesh::DEFAULT_PUSH_MIN_GAP_MS;
/// Most pushes on change per second over all peer links (the mesh crate's default).
pub const MESH_MAX_PUSH_RATE: u32 = shoal_mesh::DEFAULT_MAX_PUSH_RATE;
/// Seconds a request body may take in all, from the end of its headers.
pub const CLIENT_BODY_DEADLINE_SECS: u64 = 120;
/// Seconds between SIGTERM and closing the listener.
pub const DRAIN_SETTLE_SECS: u64 = 5;

/// Characters per token in the prompt-token estimate (see `request::estimate`).
pub const CHARS_PER_TOKEN: u64 = 4;

/// Seconds an admin removal of a worker lasts fleet-wide (the mesh's own
/// default, so one number holds with or without a mesh).
pub const WORKER_REMOVAL_TTL_SECS: u64 = shoal_mesh::DEFAULT_WORKER_REMOVAL_TTL.as_secs();

/// `service.name` of exported OpenTelemetry spans.
pub const OTEL_SERVICE_NAME: &str = "shoal";

/// Seconds a client connection has to deliver a request's headers (from
/// opening, or from its previous response: idle keep-alive too).
pub const CLIENT_HEADER_TIMEOUT_SECS: u64 = 30;
/// Seconds a request body may go without a byte arriving.
pub const CLIENT_BODY_TIMEOUT_SECS: u64 = 30;
/// Client connections open at once (0 = from the open-file limit).
pub const MAX_CLIENT_CONNECTIONS: usize = 0;
/// Concurrent streams per HTTP/2 client connection.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 256;

/// Tokens per KV block the engines use (vLLM's default; SGLang's page size
/// is 1 unless `--page-size` is set, so set this to match).
pub const KV_BLOCK_SIZE: usize = 16;
/// The EndpointSlice port names discovery reads a worker's KV-event
/// sockets from (a Service port `kv-events`, and `kv-events-replay` for
/// the replay socket), on the endpoint's own address.
pub const KV_EVENTS_PORT_NAME: &str = "kv-events";
/// See [`KV_EVENTS_PORT_NAME`].
pub const KV_EVENTS_REPLAY_PORT_NAME: &str = "kv-events-replay";
/// Data-parallel ranks behind one worker URL, each publishing on
/// `--kv-events-port + rank`.
pub const KV_EVENTS_DP_RANKS: u32 = 1;
/// Blocks the index keeps per engine (rank); past it, new blocks are not
/// indexed. 262,144 blocks of 16 tokens is 4M tokens of KV per engine.
pub const KV_INDEX_MAX_BLOCKS_PER_ENGINE: usize = 262_144;

/// Bytes of token ids each tokenizer keeps for recent prompts' prefixes
/// (`kv_events::token_cache`): 64 MiB holds ~16 M token ids, the
/// histories of a few thousand long conversations, so a later turn
/// tokenizes only its new text.
pub const KV_TOKEN_CACHE_BYTES: usize = 64 << 20;
/// `precise_prefix`'s bounded-load slack: a worker may take a request
/// while its wait and fleet in-flight requests are within `1 + ε` of the
/// candidates' mean. Looser than `prefix_affinity`'s because the index is
/// exact: a conversation's later turn has one engine holding its history,
/// and moving it re-prefills the history and duplicates it in a second
/// cache. Measured on the Mooncake conversation trace (tests/BENCHMARKS.md,
/// 4 meshed replicas, 8 engines): ε = 0.25 → 1 → 3 raised the fleet cache
/// hit from 16–19 % to 24 % to 28 % (`cache_aware`'s one router: 28 %) and
/// lowered TTFT p99; on the synthetic agentic trace (one hot tool prefix)
/// ε = 3 lets the busiest engine reach ~1.5 × the mean share where ε = 1
/// keeps it near 1.3 ×, so fleets dominated by one hot prefix may set 1.
/// With `--least-load-min-throughput` flooring the waits, ε = 5 reached
/// `cache_aware`'s one-router hit meshed (28.3 % median against 28.3 %,
/// where ε = 3 gave 28.1 %) with the agentic trace's TTFT p99 no worse.
pub const PRECISE_PREFIX_EPSILON: f64 = 5.0;
/// What `precise_prefix` counts a second of prefill saved by a cached
/// prefix as, in seconds of queue. The wait it is weighed against counts a
/// prompt token as one token of work, but a miss's prefill also stalls
/// the decode steps of every request batched with it and evicts other
/// prefixes to hold a second copy; at 100 the cache decides whenever the
/// load guard admits its holder (3 lost 3–4 points of hit rate on the
/// conversation trace, tests/BENCHMARKS.md).
pub const PRECISE_PREFIX_CACHE_WEIGHT: f64 = 100.0;
/// `precise_prefix`'s near-tie band, in multiples of the request's own
/// work: candidates scoring within it of the best are settled by cache,
/// then rendezvous. Measured on the Mooncake conversation trace (one seed
/// each of 42 and 43, 4 replicas): 1 → 3 raised replica agreement from
/// 90–96 % to 96–98 % and the meshed hit rate from 17 % to 20–21 %; 6 was
/// worse on both (hit 17 %).
pub const PRECISE_PREFIX_NEAR_TIE_WORK: f64 = 3.0;
/// Bytes of prompt text `precise_prefix` tokenizes at most (~64k tokens).
pub const PRECISE_PREFIX_MAX_PROMPT_BYTES: usize = 256 * 1024;
