//! Mesh load-plane frames: `shoal_proto::frames::decode` on arbitrary bytes
//! must return an error or a frame that re-encodes and decodes to itself;
//! the same bytes read as packed slot changes must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::frames::{Frame, decode, encode};
use shoal_proto::slot_pack::unpack;

fuzz_target!(|data: &[u8]| {
    let _ = unpack(data);
    if let Ok(Frame::Packed(packed)) = decode(data) {
        let _ = unpack(&packed.slots);
    }
    if let Ok(frame) = decode(data)
        && let Ok(bytes) = encode(&frame)
    {
        let again = decode(&bytes);
        assert!(again.is_ok(), "a re-encoded frame must decode: {again:?}");
    }
});
