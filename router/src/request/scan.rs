//! One pass over a JSON request body that reads what routing needs and
//! keeps nothing else: the prompt is counted as it is parsed, never built.
//!
//! Why not `#[derive(Deserialize)]` into prompt types: a prompt may be a
//! string, a list of strings, token ids, a list of id lists or content
//! parts, and an untagged enum over those shapes makes serde buffer every
//! element as a generic `Content` value before it tries each shape — a
//! 60 MB `{"prompt":[1,1,…]}` became about 2 GB of buffers. Here each
//! value is visited in place ([`Node`] counts characters and ids, and
//! copies at most the first `text_limit` bytes of text a policy reads), so
//! memory stays at the body itself and nesting is bounded by serde_json's
//! recursion limit.
//!
//! A field of an unexpected type (a numeric `model`, `"max_tokens":"x"`, a
//! boolean inside a prompt) marks the body *odd*: it is still proxied, and
//! priced from its byte length as the module doc of `request` says.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What one pass read from a body.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Characters of prompt text.
    pub chars: u64,
    /// Token ids in the prompt.
    pub ids: u64,
    /// The first `text_limit` bytes of prompt text (or a little more, to
    /// end on a character boundary), parts joined by `\n`; `None` when the
    /// caller asked for no text.
    pub text: Option<String>,
    /// `model`, when a string.
    pub model: Option<String>,
    /// `max_tokens`, `max_completion_tokens` and SGLang's
    /// `sampling_params.max_new_tokens`, in that order of precedence.
    pub max_tokens: [Option<u64>; 3],
    /// `stream`.
    pub stream: Option<bool>,
    /// `previous_response_id` and `input_file_id`, when strings.
    pub builds_on: [Option<String>; 2],
    /// A field the router reads had an unexpected type, or the body is not
    /// an object.
    pub odd: bool,
    /// Each of `messages`, in order, when text is kept: its role and where
    /// its content sits in `text`.
    pub turns: Vec<Turn>,
    text_limit: usize,
}

/// One chat message as [`Scanned::text`] holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Turn {
    /// `role`, when a string.
    pub role: Option<String>,
    /// The byte range of its content (text parts joined by `\n`) in the
    /// kept text; cut short, or empty, past the text limit.
    pub content: std::ops::Range<usize>,
}

/// Reads `body`, keeping up to `text_limit` bytes of prompt text when
/// `Some`; an error only when the body is not JSON at all (or nests
/// deeper than serde_json's recursion limit).
pub fn scan(body: &[u8], text_limit: Option<usize>) -> Result<Scanned, serde_json::Error> {
    let mut scanned = Scanned {
        text: text_limit.map(|_| String::new()),
        text_limit: text_limit.unwrap_or(0),
        ..Scanned::default()
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    Node {
        s: &mut scanned,
        at: Place::Body,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(scanned)
}

/// The first `limit` bytes of `text` (or up to 3 more, to end on a
/// character boundary).
pub fn head_of(text: &str, limit: usize) -> &str {
    let end = (limit.min(text.len())..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    &text[..end]
}

impl Scanned {
    /// The stored object the request builds on: a Responses request's
    /// `previous_response_id`, else a batch's `input_file_id`.
    pub fn builds_on(&self) -> Option<String> {
        let [previous, file] = &self.builds_on;
        previous.clone().or_else(|| file.clone())
    }

    fn add_str(&mut self, s: &str) {
        self.chars += s.chars().count() as u64;
        let limit = self.text_limit;
        let Some(buffer) = &mut self.text else {
            return;
        };
        if buffer.len() >= limit {
            return;
        }
        if !buffer.is_empty() {
            buffer.push('\n');
        }
        buffer.push_str(head_of(s, limit.saturating_sub(buffer.len())));
    }
}

/// Object keys routing reads, wherever they occur.
enum Key {
    Model,
    Messages,
    /// `prompt`, `input`, `input_ids`.
    Prompt,
    /// `text`: a prompt field, and a content part's text.
    Text,
    /// `max_tokens`, `max_completion_tokens`: its index in
    /// [`Scanned::max_tokens`].
    MaxTokens(usize),
    SamplingParams,
    MaxNewTokens,
    Stream,
    Content,
    Role,
    /// `previous_response_id`, `input_file_id`: its index in
    /// [`Scanned::builds_on`].
    BuildsOn(usize),
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;
        impl Visitor<'_> for Names {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
                Ok(match name {
                    "model" => Key::Model,
                    "messages" => Key::Messages,
                    "prompt" | "input" | "input_ids" => Key::Prompt,
                    "text" => Key::Text,
                    "max_tokens" => Key::MaxTokens(0),
                    "max_completion_tokens" => Key::MaxTokens(1),
                    "sampling_params" => Key::SamplingParams,
                    "max_new_tokens" => Key::MaxNewTokens,
                    "stream" => Key::Stream,
                    "content" => Key::Content,
                    "role" => Key::Role,
                    "previous_response_id" => Key::BuildsOn(0),
                    "input_file_id" => Key::BuildsOn(1),
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(Names)
    }
}

/// Where in the body a value sits, which says what shapes it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The whole body: an object.
    Body,
    /// A prompt field's value (`top`, where `null` means absent) or an
    /// element of a prompt list: text, token ids, lists, content parts.
    Prompt { top: bool },
    /// A content part's `text`: a string (or `null`).
    PartText,
    /// `messages`: a list of messages (or `null`).
    Messages,
    /// One message: an object whose `content` is a prompt.
    Message,
    /// `sampling_params`: an object whose `max_new_tokens` is read.
    Sampling,
}

/// One value of the body, read for what its [`Place`] needs.
struct Node<'a> {
    s: &'a mut Scanned,
    at: Place,
}

impl Node<'_> {
    fn odd<E>(self) -> Result<(), E> {
        self.s.odd = true;
        Ok(())
    }

    fn child(&mut self, at: Place) -> Node<'_> {
        Node { s: self.s, at }
    }

    fn number<E>(self) -> Result<(), E> {
        match self.at {
            Place::Prompt { .. } => {
                self.s.ids += 1;
                Ok(())
            }
            _ => self.odd(),
        }
    }

    /// Reads the value of `key` in an object at this place.
    fn field<'de, A: MapAccess<'de>>(&mut self, key: Key, map: &mut A) -> Result<(), A::Error> {
        let s = &mut *self.s;
        match (self.at, key) {
            (Place::Body, Key::Model) => {
                s.model = map.next_value::<Scalar>()?.string(&mut s.odd);
            }
            (Place::Body, Key::Messages) => map.next_value_seed(self.child(Place::Messages))?,
            (Place::Body, Key::Prompt | Key::Text) => {
                map.next_value_seed(self.child(Place::Prompt { top: true }))?;
            }
            (Place::Body, Key::MaxTokens(i)) => {
                s.max_tokens[i] = map.next_value::<Scalar>()?.count(&mut s.odd);
            }
            (Place::Body, Key::SamplingParams) => {
                map.next_value_seed(self.child(Place::Sampling))?;
            }
            (Place::Body, Key::BuildsOn(i)) => {
                s.builds_on[i] = map.next_value::<Scalar>()?.string(&mut s.odd);
            }
            (Place::Body, Key::Stream) => {
                s.stream = map.next_value::<Scalar>()?.flag(&mut s.odd);
            }
            (Place::Prompt { .. }, Key::Text) => {
                map.next_value_seed(self.child(Place::PartText))?
            }
            (Place::Message, Key::Content) => {
                let before = s.text.as_ref().map_or(0, String::len);
                map.next_value_seed(self.child(Place::Prompt { top: true }))?;
                let s = &mut *self.s;
                let after = s.text.as_ref().map_or(0, String::len);
                // add_str put a `\n` before the content's first part
                // unless it came first.
                let start = before + usize::from(before > 0 && after > before);
                if let Some(turn) = s.turns.last_mut() {
                    turn.content = start..after;
                }
            }
            (Place::Message, Key::Role) => {
                let role = map.next_value::<Scalar>()?.string(&mut s.odd);
                if let Some(turn) = s.turns.last_mut() {
                    turn.role = role;
                }
            }
            (Place::Sampling, Key::MaxNewTokens) => {
                s.max_tokens[2] = map.next_value::<Scalar>()?.count(&mut s.odd);
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON value ({:?})", self.at)
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        match self.at {
            Place::Prompt { .. } | Place::PartText => {
                self.s.add_str(v);
                Ok(())
            }
            _ => self.odd(),
        }
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.number()
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.number()
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.number()
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.odd()
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        match self.at {
            Place::Prompt { top: true } | Place::PartText | Place::Messages | Place::Sampling => {
                Ok(())
            }
            _ => self.odd(),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let element = match self.at {
            Place::Prompt { .. } => Place::Prompt { top: false },
            Place::Messages => Place::Message,
            _ => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return self.odd();
            }
        };
        while seq.next_element_seed(self.child(element))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        if matches!(self.at, Place::PartText | Place::Messages) {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return self.odd();
        }
        if self.at == Place::Message && self.s.text.is_some() {
            self.s.turns.push(Turn::default());
        }
        while let Some(key) = map.next_key::<Key>()? {
            self.field(key, &mut map)?;
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A field the router reads as one scalar, of whatever type it came as.
enum Scalar {
    Str(String),
    Count(u64),
    Flag(bool),
    Null,
    /// A negative or fractional number, a list or an object.
    Other,
}

impl Scalar {
    /// The string, if that is what came; anything but null marks `odd`.
    fn string(self, odd: &mut bool) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s),
            Scalar::Null => None,
            _ => {
                *odd = true;
                None
            }
        }
    }

    /// The non-negative integer, if that is what came.
    fn count(self, odd: &mut bool) -> Option<u64> {
        match self {
            Scalar::Count(n) => Some(n),
            Scalar::Null => None,
            _ => {
                *odd = true;
                None
            }
        }
    }

    /// The boolean, if that is what came.
    fn flag(self, odd: &mut bool) -> Option<bool> {
        match self {
            Scalar::Flag(b) => Some(b),
            Scalar::Null => None,
            _ => {
                *odd = true;
                None
            }
        }
    }
}

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> Visitor<'de> for Any {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Count(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Count))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Flag(v))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        deserializer.deserialize_any(Any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_id_prompt_is_counted_without_being_built() {
        let s = scan(br#"{"model":"m","prompt":[[1,2],[3]],"stream":true}"#, None).unwrap();
        assert_eq!((s.ids, s.chars, s.odd), (3, 0, false));
        assert_eq!(s.model.as_deref(), Some("m"));
        assert_eq!(s.stream, Some(true));
        assert!(s.text.is_none(), "no text asked for");
        let s = scan(br#"{"input":"x","previous_response_id":"resp_1"}"#, None).unwrap();
        assert_eq!(s.builds_on().as_deref(), Some("resp_1"));
        let s = scan(br#"{"input_file_id":"file-2"}"#, None).unwrap();
        assert_eq!(s.builds_on().as_deref(), Some("file-2"));
    }

    #[test]
    fn text_is_kept_only_up_to_its_limit_and_on_a_character_boundary() {
        let s = scan(
            br#"{"messages":[{"role":"user","content":"h\u00e9llo"}]}"#,
            Some(2),
        )
        .unwrap();
        assert_eq!(
            s.text.as_deref(),
            Some("h\u{e9}"),
            "the 2nd byte is inside é"
        );
        assert_eq!(s.chars, 5);
        let s = scan(br#"{"prompt":["abc","def"]}"#, Some(5)).unwrap();
        assert_eq!(s.text.as_deref(), Some("abc\nd"));
        assert_eq!(head_of("abc", 10), "abc");
    }

    #[test]
    fn each_message_keeps_its_role_and_where_its_content_is() {
        let body = br#"{"messages":[{"content":"be brief","role":"system"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null},{"role":"user","content":"\nq"}]}"#;
        let s = scan(body, Some(1024)).unwrap();
        let text = s.text.as_deref().unwrap();
        let turns: Vec<(Option<&str>, &str)> = s
            .turns
            .iter()
            .map(|t| (t.role.as_deref(), &text[t.content.clone()]))
            .collect();
        assert_eq!(
            turns,
            [
                (Some("system"), "be brief"),
                (Some("user"), "a\nb"),
                (Some("assistant"), ""),
                (Some("user"), "\nq"),
            ]
        );
        assert!(
            scan(body, None).unwrap().turns.is_empty(),
            "no text, no turns"
        );
        let cut = scan(body, Some(10)).unwrap();
        let text = cut.text.as_deref().unwrap();
        assert_eq!(&text[cut.turns[1].content.clone()], "a");
    }

    #[test]
    fn fields_of_unexpected_types_mark_the_body_odd() {
        for body in [
            &br#"{"model":7}"#[..],
            br#"{"max_tokens":"x"}"#,
            br#"{"max_tokens":-1}"#,
            br#"{"prompt":[true]}"#,
            br#"{"prompt":[null]}"#,
            br#"{"messages":5}"#,
            br#"{"messages":[7]}"#,
            br#"{"messages":[{"content":[{"text":3}]}]}"#,
            br#"{"sampling_params":[1]}"#,
            br#"[1,2,3]"#,
            br#""text""#,
        ] {
            let s = scan(body, Some(64)).unwrap();
            assert!(s.odd, "{}", String::from_utf8_lossy(body));
        }
        let s = scan(
            br#"{"model":null,"prompt":null,"messages":null,"max_tokens":null,"stream":null,"extra":{"a":[1]}}"#,
            None,
        )
        .unwrap();
        assert!(!s.odd, "null is absent, unknown fields are skipped");
    }

    #[test]
    fn escaped_keys_and_nesting_beyond_the_limit_are_handled() {
        let s = scan(br#"{"\u006dodel":"m","pro\u006dpt":"abcd"}"#, None).unwrap();
        assert_eq!(s.model.as_deref(), Some("m"));
        assert_eq!(s.chars, 4);
        let deep = format!(
            r#"{{"prompt":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let err = scan(deep.as_bytes(), None).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
        assert!(scan(br#"{"a":1} x"#, None).is_err(), "trailing characters");
    }
}
