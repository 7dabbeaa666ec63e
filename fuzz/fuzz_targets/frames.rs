//! Mesh load-plane frames: `shoal_proto::frames::decode` on arbitrary bytes
//! must return an error or a frame that re-encodes and decodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::frames::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = decode(data)
        && let Ok(bytes) = encode(&frame)
    {
        let again = decode(&bytes);
        assert!(again.is_ok(), "a re-encoded frame must decode: {again:?}");
    }
});
