//! Worker base URLs: the one rule every entry point (flags, admin API,
//! CLI) uses to check and normalise them. A leaf: it depends on nothing in
//! the crate.

use http::Uri;

/// Checks and normalises a worker base URL: `http[s]://host[:port][/prefix]`,
/// no query, no trailing slash (`https://` engines are reached over TLS;
/// see `engine_tls`).
pub fn normalize_url(text: &str) -> Result<String, String> {
    let trimmed = text.trim().trim_end_matches('/');
    let uri: Uri = trimmed
        .parse()
        .map_err(|err| format!("`{text}` is not a URL: {err}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "`{text}`: scheme `{other}` is not supported (use http:// or https://)"
            ));
        }
        None => return Err(format!("`{text}` needs a scheme, e.g. http://{text}")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("`{text}` has no host"));
    };
    if authority.host().is_empty() {
        return Err(format!("`{text}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{text}` must not carry a query string"));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_and_checked() {
        assert_eq!(
            normalize_url("http://127.0.0.1:8000/").unwrap(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            normalize_url(" http://engine:8000/v1prefix ").unwrap(),
            "http://engine:8000/v1prefix"
        );
        assert!(
            normalize_url("127.0.0.1:8000")
                .unwrap_err()
                .contains("scheme")
        );
        assert!(normalize_url("ftp://x").unwrap_err().contains("ftp"));
        assert!(
            normalize_url("http://x/?a=1")
                .unwrap_err()
                .contains("query")
        );
        assert!(normalize_url("not a url").is_err());
    }
}
