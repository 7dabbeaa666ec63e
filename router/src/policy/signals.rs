//! Engine signals as policies may use them: re-validated where they are
//! read, so a value that slipped past the edge (or came from a peer) is
//! missing, never a comparison with NaN.

use shoal_proto::EngineLoad;

use crate::fleet::WorkerLoad;

/// The fresh engine snapshot, unless it carries no signal at all (such a
/// snapshot tells as little as none).
#[inline]
pub(crate) fn engine(load: &WorkerLoad) -> Option<&EngineLoad> {
    load.engine.as_ref().filter(|e| !e.is_empty())
}

/// KV-cache usage `k` from a fresh snapshot, if finite and within 0..=1.
#[inline]
pub(crate) fn token_usage(load: &WorkerLoad) -> Option<f64> {
    load.engine
        .and_then(|e| e.token_usage)
        .filter(|k| k.is_finite() && (0.0..=1.0).contains(k))
}

/// Reported generation throughput, if finite and > 0.
#[inline]
pub(crate) fn throughput(engine: &EngineLoad) -> Option<f64> {
    engine.gen_throughput.filter(|t| t.is_finite() && *t > 0.0)
}

/// Engine waiting-queue length from a fresh snapshot.
#[inline]
pub(crate) fn waiting(load: &WorkerLoad) -> Option<u64> {
    load.engine.and_then(|e| e.waiting_requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_numbers_are_missing() {
        let mut load = WorkerLoad {
            engine: Some(EngineLoad {
                token_usage: Some(f64::NAN),
                gen_throughput: Some(0.0),
                ..EngineLoad::default()
            }),
            ..WorkerLoad::default()
        };
        assert_eq!(token_usage(&load), None);
        assert_eq!(throughput(&load.engine.unwrap()), None);
        load.engine = Some(EngineLoad {
            token_usage: Some(1.2),
            gen_throughput: Some(f64::INFINITY),
            ..EngineLoad::default()
        });
        assert_eq!(token_usage(&load), None);
        assert_eq!(throughput(&load.engine.unwrap()), None);
        load.engine = Some(EngineLoad::default());
        assert!(engine(&load).is_none(), "an empty snapshot is no snapshot");
    }
}
