//! Disaggregated prefill/decode flags: which workers prefill, which
//! decode, which protocol hands the KV over, and how each pool is chosen.

use clap::{Args, ValueEnum};

use super::{PolicyKind, defaults, parsers};

/// Help heading of the disaggregation flags.
pub const DISAGG_FLAGS: &str = "Disaggregated prefill/decode";

/// How a prefill worker's KV reaches the decode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PdProtocol {
    /// SGLang: the request goes to both workers at once with
    /// `bootstrap_host`, `bootstrap_port` and `bootstrap_room`; the decode
    /// worker pulls the KV from the prefill worker's bootstrap server.
    Sglang,
    /// vLLM (NIXL and similar connectors): the prefill worker runs the
    /// request with `max_tokens` 1 and answers `kv_transfer_params`, which
    /// the decode worker gets with the original request.
    Vllm,
}

impl PdProtocol {
    /// The protocol's metric label.
    pub fn label(self) -> &'static str {
        match self {
            PdProtocol::Sglang => "sglang",
            PdProtocol::Vllm => "vllm",
        }
    }
}

/// `--prefill-urls`, `--decode-urls`, `--pd-protocol` and the per-pool
/// policies: the disaggregated dispatch is built from this group.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = DISAGG_FLAGS)]
pub struct DisaggConfig {
    /// Prefill workers of a disaggregated fleet (base URLs, comma
    /// separated). Chat, completions and SGLang /generate requests are then
    /// prefilled on one of them and decoded on another worker; every other
    /// request goes to the decode pool only. Needs --pd-protocol.
    #[arg(long, env = "SHOAL_PREFILL_URLS", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',', value_parser = parsers::worker_url)]
    pub prefill_urls: Vec<String>,

    /// Decode workers of a disaggregated fleet (with --worker-urls, every
    /// worker not in --prefill-urls decodes).
    #[arg(long, env = "SHOAL_DECODE_URLS", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',', value_parser = parsers::worker_url)]
    pub decode_urls: Vec<String>,

    /// How the KV is handed from prefill to decode: sglang (bootstrap room)
    /// or vllm (kv_transfer_params).
    #[arg(long, env = "SHOAL_PD_PROTOCOL", value_enum)]
    pub pd_protocol: Option<PdProtocol>,

    /// Policy choosing the prefill worker (default: --policy).
    #[arg(long, env = "SHOAL_PREFILL_POLICY", value_enum)]
    pub prefill_policy: Option<PolicyKind>,

    /// Policy choosing the decode worker (default: --policy).
    #[arg(long, env = "SHOAL_DECODE_POLICY", value_enum)]
    pub decode_policy: Option<PolicyKind>,

    /// Prompts of fewer estimated tokens skip the prefill pool and run
    /// whole on a decode worker (vllm protocol only: an SGLang decode
    /// server takes its KV from a prefill server for every request).
    /// 0 = always disaggregate.
    #[arg(long, env = "SHOAL_PD_MIN_PROMPT_TOKENS", default_value_t = defaults::PD_MIN_PROMPT_TOKENS)]
    pub pd_min_prompt_tokens: u64,

    /// SGLang bootstrap port of a prefill worker whose `GET /server_info`
    /// does not name one (SGLang's own default).
    #[arg(long, env = "SHOAL_PD_BOOTSTRAP_PORT", default_value_t = defaults::PD_BOOTSTRAP_PORT)]
    pub pd_bootstrap_port: u16,
}

impl Default for DisaggConfig {
    /// The flag defaults: not disaggregated.
    fn default() -> Self {
        Self {
            prefill_urls: Vec::new(),
            decode_urls: Vec::new(),
            pd_protocol: None,
            prefill_policy: None,
            decode_policy: None,
            pd_min_prompt_tokens: defaults::PD_MIN_PROMPT_TOKENS,
            pd_bootstrap_port: defaults::PD_BOOTSTRAP_PORT,
        }
    }
}

impl DisaggConfig {
    /// The protocol when the fleet is disaggregated: a protocol, and
    /// prefill workers given or found by discovery (`discovers_roles`:
    /// `--discovery-role-label`).
    pub fn protocol(&self, discovers_roles: bool) -> Option<PdProtocol> {
        self.pd_protocol
            .filter(|_| discovers_roles || !self.prefill_urls.is_empty())
    }

    /// Checks that the flags fit together (`discovers_roles`: discovery
    /// reads each engine's pool from a label); the message names them.
    pub fn validate(&self, discovers_roles: bool) -> Result<(), String> {
        let has_pools = discovers_roles || !self.prefill_urls.is_empty();
        match (has_pools, self.pd_protocol) {
            (true, None) => {
                return Err(
                    "--prefill-urls and --discovery-role-label need --pd-protocol (sglang or vllm): how the KV reaches the decode worker".into(),
                );
            }
            (false, Some(_)) => {
                return Err(
                    "--pd-protocol needs the prefill workers: --prefill-urls or --discovery-role-label".into(),
                );
            }
            _ => {}
        }
        if let Some(url) = self
            .prefill_urls
            .iter()
            .find(|u| self.decode_urls.contains(u))
        {
            return Err(format!(
                "{url} is in both --prefill-urls and --decode-urls: a worker is in one pool"
            ));
        }
        if self.pd_min_prompt_tokens > 0 && self.pd_protocol == Some(PdProtocol::Sglang) {
            return Err(
                "--pd-min-prompt-tokens needs --pd-protocol vllm: an SGLang decode server takes its KV from a prefill server for every request".into(),
            );
        }
        Ok(())
    }
}
