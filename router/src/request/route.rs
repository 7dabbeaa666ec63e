//! Which requests the router proxies: every OpenAI-compatible inference
//! route, the engines' native ones, and anything else under `/v1/`.
//!
//! Why a table: a route decides three things about a request before it is
//! routed — how its body is read (JSON, multipart audio, or whatever it
//! is), whether it costs the engine token-work or only a request slot
//! (tokenizing runs no model), and the metric label it is counted under.
//! An unknown path under `/v1/` is still proxied (agent clients call
//! routes this table has never heard of) under the one label `other`, so a
//! client inventing paths cannot grow the metric series without bound.

use http::Method;

/// How a route's body is read before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// A JSON object: a body that is not JSON is refused with 400.
    Json,
    /// `multipart/form-data` (audio uploads): only the `model` field is read.
    Multipart,
    /// Anything: read as JSON when it is, otherwise passed on untouched.
    Opaque,
}

/// What a request on a route costs the engine, for its booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Prompt and output tokens: the model runs.
    Tokens,
    /// One request slot and no token-work (tokenizing, listing): booking
    /// the text's tokens would make the engine look busier than it is.
    RequestOnly,
}

/// A proxied route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /generate` (SGLang native)
    Generate,
    /// `POST /v1/responses` (OpenAI Responses API)
    Responses,
    /// `POST /v1/messages` (Anthropic Messages API, served by vLLM and SGLang)
    Messages,
    /// `POST /v1/rerank`, `/rerank`, `/v2/rerank`
    Rerank,
    /// `POST /v1/score`, `/score`
    Score,
    /// `POST /classify`, `/v1/classify`
    Classify,
    /// `POST /pooling` (vLLM)
    Pooling,
    /// `POST /tokenize`
    Tokenize,
    /// `POST /detokenize`
    Detokenize,
    /// `POST /v1/audio/transcriptions` (multipart)
    AudioTranscriptions,
    /// `POST /v1/audio/translations` (multipart)
    AudioTranslations,
    /// `POST /v1/audio/speech`
    AudioSpeech,
    /// Any other method or path under `/v1/` (except `GET /v1/models`,
    /// which the router answers itself).
    Other,
}

/// The `POST` paths of every named route (a route may have several).
const POST_PATHS: [(&str, Route); 19] = [
    ("/v1/chat/completions", Route::ChatCompletions),
    ("/v1/completions", Route::Completions),
    ("/v1/embeddings", Route::Embeddings),
    ("/generate", Route::Generate),
    ("/v1/responses", Route::Responses),
    ("/v1/messages", Route::Messages),
    ("/v1/rerank", Route::Rerank),
    ("/rerank", Route::Rerank),
    ("/v2/rerank", Route::Rerank),
    ("/v1/score", Route::Score),
    ("/score", Route::Score),
    ("/classify", Route::Classify),
    ("/v1/classify", Route::Classify),
    ("/pooling", Route::Pooling),
    ("/tokenize", Route::Tokenize),
    ("/detokenize", Route::Detokenize),
    ("/v1/audio/transcriptions", Route::AudioTranscriptions),
    ("/v1/audio/translations", Route::AudioTranslations),
    ("/v1/audio/speech", Route::AudioSpeech),
];

impl Route {
    /// Every route, for per-route tables (metric handles).
    pub const ALL: [Route; 16] = [
        Route::ChatCompletions,
        Route::Completions,
        Route::Embeddings,
        Route::Generate,
        Route::Responses,
        Route::Messages,
        Route::Rerank,
        Route::Score,
        Route::Classify,
        Route::Pooling,
        Route::Tokenize,
        Route::Detokenize,
        Route::AudioTranscriptions,
        Route::AudioTranslations,
        Route::AudioSpeech,
        Route::Other,
    ];

    /// The route a request with this method and path is proxied on, or
    /// `None` when the router answers it itself (health, metrics, admin,
    /// `GET /v1/models`, and unknown paths outside `/v1/`).
    pub fn for_request(method: &Method, path: &str) -> Option<Route> {
        if method == Method::POST
            && let Some((_, route)) = POST_PATHS.iter().find(|(p, _)| *p == path)
        {
            return Some(*route);
        }
        let listing = method == Method::GET && path == "/v1/models";
        (path.starts_with("/v1/") && !listing).then_some(Route::Other)
    }

    /// The main path of a named route (the first one in the table), used
    /// by tests and docs; `/v1/` for [`Route::Other`].
    pub fn path(self) -> &'static str {
        POST_PATHS
            .iter()
            .find(|(_, route)| *route == self)
            .map_or("/v1/", |(path, _)| path)
    }

    /// Position in [`Route::ALL`], for per-route tables.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short label for metrics (a fixed set: unknown paths are `other`).
    pub fn label(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Embeddings => "embeddings",
            Route::Generate => "generate",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::Rerank => "rerank",
            Route::Score => "score",
            Route::Classify => "classify",
            Route::Pooling => "pooling",
            Route::Tokenize => "tokenize",
            Route::Detokenize => "detokenize",
            Route::AudioTranscriptions => "audio_transcriptions",
            Route::AudioTranslations => "audio_translations",
            Route::AudioSpeech => "audio_speech",
            Route::Other => "other",
        }
    }

    /// How this route's body is read.
    pub fn body(self) -> BodyKind {
        match self {
            Route::AudioTranscriptions | Route::AudioTranslations => BodyKind::Multipart,
            Route::Other => BodyKind::Opaque,
            _ => BodyKind::Json,
        }
    }

    /// What a request on this route is booked as.
    pub fn work(self) -> Work {
        match self {
            Route::Tokenize | Route::Detokenize => Work::RequestOnly,
            _ => Work::Tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_route_is_found_by_its_paths_and_indexes_its_table() {
        for (i, route) in Route::ALL.into_iter().enumerate() {
            assert_eq!(route.index(), i, "{route:?}");
            if route != Route::Other {
                assert_eq!(Route::for_request(&Method::POST, route.path()), Some(route));
            }
        }
        for (path, route) in POST_PATHS {
            assert_eq!(
                Route::for_request(&Method::POST, path),
                Some(route),
                "{path}"
            );
        }
        let labels: std::collections::HashSet<_> = Route::ALL.map(Route::label).into();
        assert_eq!(labels.len(), Route::ALL.len(), "labels are distinct");
    }

    #[test]
    fn unknown_v1_paths_and_methods_pass_through_under_one_label() {
        let other = Some(Route::Other);
        assert_eq!(Route::for_request(&Method::POST, "/v1/made/up"), other);
        assert_eq!(Route::for_request(&Method::GET, "/v1/responses/r1"), other);
        assert_eq!(
            Route::for_request(&Method::DELETE, "/v1/responses/r1"),
            other
        );
        assert_eq!(
            Route::for_request(&Method::GET, "/v1/chat/completions"),
            other
        );
        assert_eq!(Route::Other.label(), "other");
        // The router's own answers.
        assert_eq!(Route::for_request(&Method::GET, "/v1/models"), None);
        assert_eq!(Route::for_request(&Method::GET, "/health"), None);
        assert_eq!(Route::for_request(&Method::POST, "/workers"), None);
        assert_eq!(Route::for_request(&Method::POST, "/nope"), None);
        assert_eq!(Route::for_request(&Method::GET, "/generate"), None);
    }

    #[test]
    fn audio_uploads_are_multipart_and_tokenizing_books_no_tokens() {
        assert_eq!(Route::AudioTranscriptions.body(), BodyKind::Multipart);
        assert_eq!(Route::AudioSpeech.body(), BodyKind::Json);
        assert_eq!(Route::Other.body(), BodyKind::Opaque);
        assert_eq!(Route::Tokenize.work(), Work::RequestOnly);
        assert_eq!(Route::Detokenize.work(), Work::RequestOnly);
        assert_eq!(Route::ChatCompletions.work(), Work::Tokens);
    }
}
