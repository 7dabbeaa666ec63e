//! The CPU budget of a scenario: CPU time (user + system) used by the
//! `shoal` replica processes, by this process (the mock engines run in it,
//! beside the load generator and the KV sampler) and by the whole machine,
//! divided by the wall time of the load, i.e. "cores used".
//!
//! The benchmark runs on a small shared box, so a mesh that costs the
//! replicas CPU competes with the engines and the generator for the same
//! cores; these figures tell whether a latency gap is routing or contention.
//! Linux only (`/proc`); elsewhere every figure is `None`.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second assumed when `getconf CLK_TCK` cannot be run
/// (the value on every mainstream Linux build).
pub const DEFAULT_CLOCK_TICKS: f64 = 100.0;

/// Clock ticks per second of `/proc` CPU times (`getconf CLK_TCK`, read
/// once; [`DEFAULT_CLOCK_TICKS`] if that fails).
pub fn clock_ticks_per_sec() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(DEFAULT_CLOCK_TICKS)
    })
}

/// utime + stime, in clock ticks, from the text of a `/proc/PID/stat`
/// (fields 14 and 15; the command name in field 2 may hold spaces and
/// parentheses, so fields are counted from its last `)`).
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: field 3 (state) is index 0, utime (14) is index 11.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Busy clock ticks of the whole machine from the text of `/proc/stat`:
/// user + nice + system + irq + softirq + steal of the aggregate `cpu` line
/// (guest time is already inside user).
pub fn parse_machine_busy_ticks(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal ...
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    (v.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// CPU ticks used so far by process `pid` (`None`: this process).
pub fn process_ticks(pid: Option<u32>) -> Option<u64> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    parse_stat_ticks(&std::fs::read_to_string(path).ok()?)
}

/// CPU counters at one instant, to be subtracted from a later sample.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    replicas: Vec<(u32, u64)>,
    own: Option<u64>,
    machine: Option<u64>,
}

impl CpuSample {
    /// Reads the counters of the replica processes `pids` (those not
    /// running or not readable are left out), of this process and of the
    /// machine.
    pub fn take(pids: &[u32]) -> Self {
        let replicas = pids
            .iter()
            .filter_map(|&p| process_ticks(Some(p)).map(|t| (p, t)))
            .collect();
        Self {
            at: Instant::now(),
            replicas,
            own: process_ticks(None),
            machine: std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| parse_machine_busy_ticks(&s)),
        }
    }

    /// Cores used from `earlier` to this sample. Replica processes count
    /// only if read at both ends (one that restarted in between would get
    /// a new PID and be left out).
    pub fn usage_since(&self, earlier: &CpuSample) -> CpuUsage {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        let both: Vec<u64> = self
            .replicas
            .iter()
            .filter_map(|(pid, t)| {
                let (_, t0) = earlier.replicas.iter().find(|(p, _)| p == pid)?;
                Some(t.saturating_sub(*t0))
            })
            .collect();
        let replica_ticks = (!both.is_empty()).then(|| both.iter().sum::<u64>());
        let delta = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a.saturating_sub(b));
        CpuUsage::from_ticks(
            wall,
            clock_ticks_per_sec(),
            replica_ticks,
            delta(self.own, earlier.own),
            delta(self.machine, earlier.machine),
        )
    }
}

/// Cores used during a scenario's load (CPU seconds / wall seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    /// Wall seconds measured over.
    pub wall_secs: f64,
    /// All `shoal` replica processes together.
    pub replicas_cores: Option<f64>,
    /// This process: the mock engines plus the load generator and the KV
    /// sampler (they share one runtime, so they cannot be told apart).
    pub engines_cores: Option<f64>,
    /// The whole machine, other sessions' work included.
    pub machine_cores: Option<f64>,
}

impl CpuUsage {
    /// Converts tick deltas over `wall_secs` at `ticks_per_sec` into cores.
    pub fn from_ticks(
        wall_secs: f64,
        ticks_per_sec: f64,
        replicas: Option<u64>,
        engines: Option<u64>,
        machine: Option<u64>,
    ) -> Self {
        let cores = |t: Option<u64>| {
            t.filter(|_| wall_secs > 0.0 && ticks_per_sec > 0.0)
                .map(|t| t as f64 / ticks_per_sec / wall_secs)
        };
        Self {
            wall_secs,
            replicas_cores: cores(replicas),
            engines_cores: cores(engines),
            machine_cores: cores(machine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let stat =
            "1234 (shoal (x) y) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_ticks("1234 (shoal) S 1 2"), None);
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn machine_busy_excludes_idle_and_iowait() {
        let text = "cpu  100 5 50 1000 40 3 2 1 0 0\ncpu0 50 2 25 500 20 1 1 0 0 0\n";
        assert_eq!(parse_machine_busy_ticks(text), Some(161));
        assert_eq!(parse_machine_busy_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn ticks_become_cores() {
        let u = CpuUsage::from_ticks(10.0, 100.0, Some(500), Some(1_000), None);
        assert_eq!(u.replicas_cores, Some(0.5));
        assert_eq!(u.engines_cores, Some(1.0));
        assert_eq!(u.machine_cores, None);
        let zero = CpuUsage::from_ticks(0.0, 100.0, Some(5), None, None);
        assert_eq!(zero.replicas_cores, None);
    }

    #[test]
    fn this_process_has_readable_counters_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_ticks(None).is_some());
            assert!(clock_ticks_per_sec() > 0.0);
            let a = CpuSample::take(&[std::process::id()]);
            let b = CpuSample::take(&[std::process::id()]);
            assert!(b.usage_since(&a).replicas_cores.is_some() || b.at == a.at);
        }
    }
}
