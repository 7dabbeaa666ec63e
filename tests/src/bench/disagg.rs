//! Disaggregated fleets in the fleet benchmark (`fleet-bench --disagg
//! sglang|vllm`): the first `--prefill-engines` mock engines prefill, the
//! rest decode, and every replica is given the two pools.
//!
//! The offered load is calibrated on the pools, not on whole engines: a
//! request costs the prefill pool its uncached prompt and one token, and
//! the decode pool its output (its prompt arrives as KV); the fleet's
//! capacity is the smaller pool's.

use std::net::{IpAddr, Ipv4Addr};

use crate::mock::{EngineConfig, EngineHandle, PdRole, spawn_engines};

use super::workload::engine_capacity;

/// How a run's fleet is disaggregated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisaggSetup {
    /// `--pd-protocol`: `sglang` or `vllm`.
    pub protocol: String,
    /// Engines in the prefill pool (the rest decode).
    pub prefill_engines: usize,
}

/// A disaggregated scenario's engines (prefill first) and the replica
/// flags naming its pools.
pub struct Pools {
    /// Every engine, the prefill pool first.
    pub engines: Vec<EngineHandle>,
    /// `--prefill-urls`, `--decode-urls` and `--pd-protocol`.
    pub args: Vec<String>,
}

impl DisaggSetup {
    /// Checks the split of `engines`.
    pub fn validate(&self, engines: usize) -> Result<(), String> {
        if !["sglang", "vllm"].contains(&self.protocol.as_str()) {
            return Err(format!(
                "--disagg: unknown protocol {:?} (sglang or vllm)",
                self.protocol
            ));
        }
        if self.prefill_engines == 0 || self.prefill_engines >= engines {
            return Err(format!(
                "--prefill-engines must leave both pools an engine (got {} of {engines})",
                self.prefill_engines
            ));
        }
        Ok(())
    }

    /// Starts `engines` engines of `cfg`, split into the two pools.
    pub async fn spawn(&self, cfg: &EngineConfig, engines: usize) -> Result<Pools, String> {
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let role = |pd_role| EngineConfig {
            pd_role,
            ..cfg.clone()
        };
        let prefill = spawn_engines(&role(PdRole::Prefill), localhost, 0, self.prefill_engines)
            .await
            .map_err(|e| format!("cannot start prefill engines: {e}"))?;
        let decode = spawn_engines(
            &role(PdRole::Decode),
            localhost,
            0,
            engines - self.prefill_engines,
        )
        .await
        .map_err(|e| format!("cannot start decode engines: {e}"))?;
        let join = |pool: &[EngineHandle]| {
            pool.iter()
                .map(EngineHandle::url)
                .collect::<Vec<_>>()
                .join(",")
        };
        let args = vec![
            "--prefill-urls".into(),
            join(&prefill),
            "--decode-urls".into(),
            join(&decode),
            "--pd-protocol".into(),
            self.protocol.clone(),
        ];
        let mut engines = prefill;
        engines.extend(decode);
        Ok(Pools { engines, args })
    }

    /// Requests per model second the fleet of `engines` engines of `cfg`
    /// carries with mean prompt `p` (uncached `u`) and output `o`: the
    /// smaller pool's capacity.
    pub fn capacity(&self, cfg: &EngineConfig, engines: usize, (p, u, o): (f64, f64, f64)) -> f64 {
        let prefill = self.prefill_engines as f64 * engine_capacity(cfg, p, u, 1.0, 0.9);
        let decode = (engines - self.prefill_engines) as f64 * engine_capacity(cfg, p, 1.0, o, 0.9);
        prefill.min(decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smaller_pool_bounds_the_fleet() {
        let cfg = EngineConfig::default();
        let setup = DisaggSetup {
            protocol: "sglang".into(),
            prefill_engines: 2,
        };
        let sizes = (1_000.0, 1_000.0, 200.0);
        let whole = engine_capacity(&cfg, 1_000.0, 1_000.0, 200.0, 0.9);
        let pd = setup.capacity(&cfg, 8, sizes);
        assert!(pd > 0.0 && pd.is_finite());
        // Two prefill engines cannot prefill for eight engines' decode.
        let more_prefill = DisaggSetup {
            prefill_engines: 4,
            ..setup.clone()
        };
        assert!(more_prefill.capacity(&cfg, 8, sizes) >= pd);
        assert!(whole > 0.0);
        assert!(setup.validate(8).is_ok());
        assert!(setup.validate(2).is_err());
        assert!(
            DisaggSetup {
                protocol: "x".into(),
                prefill_engines: 1
            }
            .validate(8)
            .is_err()
        );
    }
}
