//! Reader for the Prometheus text exposition format as the engines emit it.
//!
//! It exists so the engine parsers can ask "the sum / max of metric X over
//! all its series" without caring about labels, HELP/TYPE lines or number
//! syntax.
//!
//! Why this does not delegate to the `prometheus-parse` crate (0.2.5): that
//! crate matches metric names with the regex `\w+`, so every name containing
//! a colon (`sglang:…`, `vllm:…`, `llamacpp:…`, i.e. every metric Shoal reads)
//! is silently dropped; a label value containing `}` drops the whole line;
//! and a sample whose value does not parse is skipped without a trace, so a
//! sum over the remaining series would under-report load. The subset needed
//! here is small, so this module tokenises lines itself:
//!
//! - `#` lines (HELP, TYPE, OpenMetrics `# EOF`) and blank lines are skipped.
//! - A sample is `name[{labels}] value [timestamp]`; labels are skipped
//!   quote- and escape-aware, so `}` or `,` inside a label value is harmless.
//! - Values use Rust's float syntax, which covers Prometheus' Go syntax:
//!   `24.0`, `1.7401e+09`, `1.23457e+06`, `NaN`, `+Inf`, `-Inf`.
//!
//! Aggregation rule: if ANY series of a metric is non-finite, or a line that
//! names the metric is malformed, every aggregate of that metric is `None`
//! (missing). Dropping the bad series and summing the rest would make a
//! loaded engine look lighter than it is.

use std::collections::HashMap;

use super::{ParseError, count_total, throughput_total, usage_max, valid_counter};

/// All samples of one `/metrics` body, grouped by metric name (labels are
/// dropped: every consumer aggregates over all series of a name).
#[derive(Debug, Clone, Default)]
pub struct PromText {
    series: HashMap<String, Vec<f64>>,
}

/// A line that is not a valid sample; `name` is set when the metric name was
/// readable, so that metric can be poisoned instead of under-counted.
struct BadLine<'a> {
    name: Option<&'a str>,
    reason: &'static str,
}

impl PromText {
    /// Parses a whole `/metrics` body. Malformed lines are tolerated (a
    /// malformed line whose metric name is readable poisons that metric);
    /// the text is rejected only when it has at least one non-comment line
    /// and not a single valid sample, which is what an HTML error page or a
    /// JSON body looks like. Empty text parses to an empty set.
    pub fn parse(text: &str) -> Result<PromText, ParseError> {
        let mut series: HashMap<String, Vec<f64>> = HashMap::new();
        let mut valid_lines = 0usize;
        let mut first_bad: Option<(usize, &'static str)> = None;
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_sample(line) {
                Ok((name, value)) => {
                    series.entry(name.to_owned()).or_default().push(value);
                    valid_lines += 1;
                }
                Err(bad) => {
                    if let Some(name) = bad.name {
                        series.entry(name.to_owned()).or_default().push(f64::NAN);
                    }
                    first_bad.get_or_insert((index + 1, bad.reason));
                }
            }
        }
        match first_bad {
            Some((line, reason)) if valid_lines == 0 => {
                Err(ParseError::InvalidPrometheus { line, reason })
            }
            _ => Ok(PromText { series }),
        }
    }

    /// True when at least one line named `name`, valid or not; engine parsers
    /// use it to tell "metric absent" from "metric present but invalid".
    pub fn contains(&self, name: &str) -> bool {
        self.series.contains_key(name)
    }

    /// True when the text held no sample at all.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Raw values of every series of `name` (NaN stands for a malformed line).
    pub fn values(&self, name: &str) -> Option<&[f64]> {
        self.series.get(name).map(Vec::as_slice)
    }

    /// Sum over all series of `name`; `None` if absent, if any series is
    /// non-finite, or if the sum overflows to infinity.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let values = self.finite_values(name)?;
        let total: f64 = values.iter().sum();
        total.is_finite().then_some(total)
    }

    /// Maximum over all series of `name`; `None` if absent or if any series
    /// is non-finite.
    pub fn max(&self, name: &str) -> Option<f64> {
        let values = self.finite_values(name)?;
        values.iter().copied().reduce(f64::max)
    }

    /// A request/queue count summed over series, each validated with
    /// `valid_count`; `None` if absent or any series is invalid.
    pub fn count(&self, name: &str) -> Option<u64> {
        count_total(self.values(name)?.iter().map(|v| Some(*v)))
    }

    /// A KV usage ratio: the max over series, each validated with
    /// `valid_usage`; `None` if absent or any series is invalid.
    pub fn usage(&self, name: &str) -> Option<f64> {
        usage_max(self.values(name)?.iter().map(|v| Some(*v)))
    }

    /// A tokens/s gauge summed over series (each finite and >= 0), the total
    /// validated with `valid_throughput`.
    pub fn throughput(&self, name: &str) -> Option<f64> {
        throughput_total(self.values(name)?.iter().map(|v| Some(*v)))
    }

    /// A monotonic counter summed over series; `None` if absent, non-finite
    /// or negative. Feed it to [`super::rate::CounterRate`].
    pub fn counter(&self, name: &str) -> Option<f64> {
        let values = self.finite_values(name)?;
        if values.iter().any(|v| *v < 0.0) {
            return None;
        }
        self.sum(name).and_then(valid_counter)
    }

    fn finite_values(&self, name: &str) -> Option<&[f64]> {
        self.values(name)
            .filter(|values| values.iter().all(|v| v.is_finite()))
    }
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

/// Parses one trimmed, non-comment line into (metric name, value).
fn parse_sample(line: &str) -> Result<(&str, f64), BadLine<'_>> {
    let name_len = line
        .char_indices()
        .find(|&(i, c)| !is_name_char(c, i == 0))
        .map_or(line.len(), |(i, _)| i);
    let bad = |name, reason| BadLine { name, reason };
    let (name, after) = match line.split_at_checked(name_len) {
        Some((name, after)) if !name.is_empty() => (name, after),
        _ => return Err(bad(None, "line does not start with a metric name")),
    };
    let trimmed = after.trim_start();
    let rest = if let Some(labels) = trimmed.strip_prefix('{') {
        skip_labels(labels).ok_or_else(|| bad(Some(name), "unterminated label set"))?
    } else if !after.is_empty() && trimmed.len() == after.len() {
        // The name is followed by neither whitespace nor `{` (`foo=2`).
        return Err(bad(Some(name), "unexpected character after metric name"));
    } else {
        trimmed
    };
    let mut tokens = rest.split_whitespace();
    let value = tokens
        .next()
        .ok_or_else(|| bad(Some(name), "sample without a value"))?
        .parse::<f64>()
        .map_err(|_| bad(Some(name), "sample value is not a number"))?;
    if let Some(timestamp) = tokens.next()
        && timestamp.parse::<f64>().is_err()
    {
        return Err(bad(Some(name), "sample timestamp is not a number"));
    }
    if tokens.next().is_some() {
        return Err(bad(Some(name), "trailing data after sample"));
    }
    Ok((name, value))
}

/// Given the text right after `{`, returns the text after the matching `}`,
/// honouring quoted label values with backslash escapes.
fn skip_labels(text: &str) -> Option<&str> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quotes = false;
            }
        } else if c == '"' {
            in_quotes = true;
        } else if c == '}' {
            return text.get(i + 1..);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_with_colons_labels_and_exponents() {
        let text = "# HELP vllm:x help\n# TYPE vllm:x counter\n\
                    vllm:x{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 23210.0\n\
                    vllm:y_created{engine=\"0\"} 1.7401e+09\n\
                    llamacpp:n 1.23457e+06\n";
        let prom = PromText::parse(text).unwrap();
        assert_eq!(prom.sum("vllm:x"), Some(23210.0));
        assert_eq!(prom.sum("vllm:y_created"), Some(1.7401e9));
        assert_eq!(prom.count("llamacpp:n"), Some(1_234_570));
        assert!(!prom.contains("vllm:z"));
        assert_eq!(prom.sum("vllm:z"), None);
    }

    #[test]
    fn sums_and_maxes_several_series() {
        let text = "m{engine=\"0\"} 2\nm{engine=\"1\"} 3.5\nm 1 1700000000000\n";
        let prom = PromText::parse(text).unwrap();
        assert_eq!(prom.sum("m"), Some(6.5));
        assert_eq!(prom.max("m"), Some(3.5));
        assert_eq!(prom.values("m").map(<[f64]>::len), Some(3));
    }

    #[test]
    fn any_non_finite_series_makes_the_aggregate_missing() {
        for bad in ["NaN", "+Inf", "-Inf", "nan"] {
            let text = format!("m{{a=\"0\"}} 2\nm{{a=\"1\"}} {bad}\nok 1\n");
            let prom = PromText::parse(&text).unwrap();
            assert_eq!(prom.sum("m"), None, "{bad}");
            assert_eq!(prom.max("m"), None, "{bad}");
            assert_eq!(prom.count("m"), None, "{bad}");
            assert_eq!(prom.sum("ok"), Some(1.0));
        }
        let prom = PromText::parse("big 1e308\nbig 1e308\n").unwrap();
        assert_eq!(prom.sum("big"), None);
        let prom = PromText::parse("c{a=\"0\"} 5\nc{a=\"1\"} -1\n").unwrap();
        assert_eq!(prom.counter("c"), None);
        assert_eq!(prom.count("c"), None);
    }

    #[test]
    fn tricky_label_values_do_not_break_the_line() {
        let text = "m{model=\"a}b, c=\\\"d\\\"\",x=\"{\"} 7\n";
        let prom = PromText::parse(text).unwrap();
        assert_eq!(prom.sum("m"), Some(7.0));
    }

    #[test]
    fn a_malformed_line_poisons_its_metric_only() {
        let text = "m{a=\"0\"} 3\nm{a=\"1\"} oops\nm{a=\"2\" 4\nn 1 2 3\nk 5\n";
        let prom = PromText::parse(text).unwrap();
        assert!(prom.contains("m"));
        assert_eq!(prom.sum("m"), None);
        assert_eq!(prom.sum("n"), None);
        assert_eq!(prom.sum("k"), Some(5.0));
    }

    #[test]
    fn garbage_is_an_error_and_empty_is_not() {
        for text in [
            "<html><body>502 Bad Gateway</body></html>",
            "{\"loads\":[]}",
            "foo=2",
            "\u{0}\u{1}\u{fffd}",
            "just words here",
        ] {
            assert!(
                matches!(
                    PromText::parse(text),
                    Err(ParseError::InvalidPrometheus { line: 1, .. })
                ),
                "{text:?}"
            );
        }
        assert!(PromText::parse("").unwrap().is_empty());
        assert!(PromText::parse("# only comments\n\n").unwrap().is_empty());
    }

    #[test]
    fn crlf_and_whitespace_are_tolerated() {
        let prom = PromText::parse("  a 1\r\n\tb{x=\"y\"}   2  \r\n# EOF\r\n").unwrap();
        assert_eq!(prom.sum("a"), Some(1.0));
        assert_eq!(prom.sum("b"), Some(2.0));
    }
}
