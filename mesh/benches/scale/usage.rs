//! CPU and memory of this process and its threads, read from `/proc`
//! (the workspace forbids `unsafe`, so no `getrusage`).

use std::time::Duration;

/// Kernel clock ticks per second in `/proc/*/stat` (USER_HZ: 100 on
/// every Linux this runs on).
const TICKS_PER_SEC: u64 = 100;

/// User + system CPU of the whole process so far, every thread included
/// (those that ended too), at 10 ms resolution.
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 11 and 12 here.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / TICKS_PER_SEC)
}

/// CPU time of the calling thread so far, ns precision (the scheduler's
/// own account in `/proc/thread-self/schedstat`).
pub fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// Resident set size now, MiB (0 if unreadable).
pub fn rss_mib() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else {
        return 0.0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Wall clock, µs since the Unix epoch (shared by every process here).
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
