//! Value parsers for flags whose type alone does not rule out bad values.
//! clap prefixes each error with the flag's name, so the operator sees which
//! flag was rejected and why.

/// A number that must be greater than zero (intervals, limits).
pub fn positive_u64(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("must be greater than 0".into()),
        Ok(value) => Ok(value),
        Err(err) => Err(format!("not a whole number: {err}")),
    }
}

/// [`positive_u64`] for `u32` settings.
pub fn positive_u32(text: &str) -> Result<u32, String> {
    let value = positive_u64(text)?;
    u32::try_from(value).map_err(|_| format!("must be at most {}", u32::MAX))
}

/// [`positive_u64`] for byte sizes.
pub fn positive_usize(text: &str) -> Result<usize, String> {
    let value = positive_u64(text)?;
    usize::try_from(value).map_err(|_| "too large for this platform".into())
}

/// `--io-threads`: 0 (one per core) up to [`defaults::MAX_IO_THREADS`].
pub fn io_threads(text: &str) -> Result<usize, String> {
    let value: usize = text
        .trim()
        .parse()
        .map_err(|err| format!("not a thread count: {err}"))?;
    if value > super::defaults::MAX_IO_THREADS {
        return Err(format!(
            "at most {} (0 = one per core)",
            super::defaults::MAX_IO_THREADS
        ));
    }
    Ok(value)
}

fn finite(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|err| format!("not a number: {err}"))?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err("must be a finite number".into())
    }
}

/// A fraction in 0..=1 (jitter).
pub fn unit_fraction(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err("must be between 0 and 1".into())
    }
}

/// A finite number >= 0 (weights).
pub fn non_negative(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value >= 0.0 {
        Ok(value)
    } else {
        Err("must not be negative".into())
    }
}

/// A finite number > 0 (rates).
pub fn positive(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value > 0.0 {
        Ok(value)
    } else {
        Err("must be greater than 0".into())
    }
}

/// A growth factor, at least 1.
pub fn multiplier(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value >= 1.0 {
        Ok(value)
    } else {
        Err("must be at least 1".into())
    }
}

/// An absolute URL path such as `/health`.
pub fn url_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && text.parse::<http::uri::PathAndQuery>().is_ok() {
        Ok(text.to_string())
    } else {
        Err("must be an absolute path starting with '/'".into())
    }
}

/// A worker base URL: `http://host:port` with an optional path prefix. It is
/// normalised without a trailing slash so the same engine is never
/// registered twice under two spellings.
pub fn worker_url(text: &str) -> Result<String, String> {
    crate::url::normalize_url(text)
}

/// A `host:port` gossip seed; the host may be a DNS name or an IP
/// (`[v6]:port` for IPv6).
pub fn host_port(text: &str) -> Result<String, String> {
    let text = text.trim();
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("`{text}` must be HOST:PORT"));
    };
    port.parse::<u16>()
        .map_err(|_| format!("`{text}`: `{port}` is not a port"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::IpAddr>().is_err() && !is_dns_name(bare) {
        return Err(format!(
            "`{text}`: `{host}` is neither an IP address nor a DNS name"
        ));
    }
    Ok(text.to_string())
}

/// True for a name the mesh accepts as a node name (a DNS name): one rule,
/// owned by the mesh, for flags, certificates and peers alike.
pub fn is_dns_name(name: &str) -> bool {
    shoal_mesh::identity::valid_node_name(name)
}

/// `--kv-events-endpoint`: `WORKER_URL=tcp://HOST:PORT[|tcp://HOST:PORT]`,
/// the worker URL normalised as `--worker-urls` are.
pub fn kv_events_endpoint(text: &str) -> Result<(String, String, Option<String>), String> {
    let (url, sockets) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not WORKER_URL=tcp://HOST:PORT[|tcp://HOST:PORT]"))?;
    let url = worker_url(url)?;
    let (events, replay) = match sockets.split_once('|') {
        Some((events, replay)) => (events, Some(replay)),
        None => (sockets, None),
    };
    for endpoint in std::iter::once(events).chain(replay) {
        let port = endpoint
            .strip_prefix("tcp://")
            .and_then(|rest| rest.rsplit_once(':'))
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
            return Err(format!("{endpoint:?} is not tcp://HOST:PORT"));
        }
    }
    Ok((url, events.to_string(), replay.map(str::to_string)))
}
