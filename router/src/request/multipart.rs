//! The `model` field of a `multipart/form-data` body (audio uploads).
//!
//! Why not a multipart crate: the router reads one short text field to
//! route by model and passes the body on byte for byte; it never streams
//! or stores the parts. This reads RFC 7578 bodies as clients send them
//! (`--boundary` lines, part headers, CRLF line ends) and gives up —
//! answering "no model" — on anything else, so a malformed body is still
//! proxied and the engine judges it.

use memchr::memmem;

/// Longest field value read (model names are short; a long value is not a
/// model name).
const MAX_VALUE_BYTES: usize = 1024;
/// Most part headers read before a part is skipped.
const MAX_HEADER_BYTES: usize = 8 * 1024;

/// The `boundary` parameter of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|param| {
        let (key, value) = param.split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        // RFC 2046: 1 to 70 characters.
        (!value.is_empty() && value.len() <= 70).then_some(value)
    })
}

/// The value of the text field `name` in a multipart `body` whose parts
/// are separated by `boundary`; `None` when it is absent, a file, longer
/// than 1 KiB, not UTF-8, or the body is not well formed up to it.
pub fn field<'a>(body: &'a [u8], boundary: &str, name: &str) -> Option<&'a str> {
    let delimiter = [b"\r\n--", boundary.as_bytes()].concat();
    let finder = memmem::Finder::new(&delimiter);
    // The first delimiter may open the body without the leading CRLF.
    let mut rest = body
        .strip_prefix(&delimiter[2..])
        .or_else(|| finder.find(body).map(|at| &body[at + delimiter.len()..]))?;
    loop {
        // After a delimiter: `--` closes the body, CRLF opens a part.
        if rest.starts_with(b"--") {
            return None;
        }
        let part = rest.strip_prefix(b"\r\n")?;
        let headers_end = memmem::find(&part[..part.len().min(MAX_HEADER_BYTES)], b"\r\n\r\n")?;
        let headers = &part[..headers_end];
        let content = &part[headers_end + 4..];
        let content_end = finder.find(content)?;
        if names_field(headers, name) {
            let value = &content[..content_end];
            if value.len() > MAX_VALUE_BYTES {
                return None;
            }
            return std::str::from_utf8(value).ok();
        }
        rest = &content[content_end + delimiter.len()..];
    }
}

/// Whether part `headers` declare the text field `name` (a
/// `Content-Disposition: form-data; name="..."` without a `filename`).
fn names_field(headers: &[u8], name: &str) -> bool {
    let Ok(headers) = std::str::from_utf8(headers) else {
        return false;
    };
    headers.split("\r\n").any(|line| {
        let Some((key, value)) = line.split_once(':') else {
            return false;
        };
        if !key.trim().eq_ignore_ascii_case("content-disposition") {
            return false;
        }
        let mut params = value.split(';').map(str::trim);
        if !params
            .next()
            .is_some_and(|kind| kind.eq_ignore_ascii_case("form-data"))
        {
            return false;
        }
        let mut named = false;
        for param in params {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "name" => named = value == name,
                "filename" | "filename*" => return false,
                _ => {}
            }
        }
        named
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, &str)], boundary: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for (headers, content) in parts {
            out.extend_from_slice(format!("--{boundary}\r\n{headers}\r\n\r\n").as_bytes());
            out.extend_from_slice(content.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        out
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        assert_eq!(boundary("multipart/form-data; boundary=abc"), Some("abc"));
        assert_eq!(
            boundary("Multipart/Form-Data;charset=x; BOUNDARY=\"a b\""),
            Some("a b")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(boundary("multipart/form-data"), None);
        assert_eq!(boundary("multipart/form-data; boundary="), None);
        assert_eq!(
            boundary(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
    }

    #[test]
    fn the_model_field_is_found_before_or_after_the_file() {
        let file = (
            "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav",
            "RIFF\r\n--not-the-boundary\r\nmodel",
        );
        let model = (
            "Content-Disposition: form-data; name=\"model\"",
            "whisper-1",
        );
        for parts in [[file, model], [model, file]] {
            let b = body(&parts, "XyZ");
            assert_eq!(field(&b, "XyZ", "model"), Some("whisper-1"));
            assert_eq!(field(&b, "XyZ", "language"), None);
        }
    }

    #[test]
    fn files_long_values_and_broken_bodies_give_no_model() {
        let as_file = (
            "Content-Disposition: form-data; name=\"model\"; filename=\"m\"",
            "whisper-1",
        );
        assert_eq!(field(&body(&[as_file], "b"), "b", "model"), None);
        let long = "m".repeat(MAX_VALUE_BYTES + 1);
        let part = (
            "Content-Disposition: form-data; name=\"model\"",
            long.as_str(),
        );
        assert_eq!(field(&body(&[part], "b"), "b", "model"), None);
        assert_eq!(
            field(
                b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nx",
                "b",
                "model"
            ),
            None,
            "no closing delimiter"
        );
        assert_eq!(field(b"", "b", "model"), None);
        assert_eq!(field(b"--b--\r\n", "b", "model"), None);
        assert_eq!(field(b"junk without any delimiter", "b", "model"), None);
    }
}
