#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Arbitrary bytes never panic the frame decoder and never decode into a
//! frame of another wire version.

use proptest::prelude::*;
use shoal_mesh::proto::frames::{FRAME_VERSION, Frame, decode, encode};

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic(flip in 0usize..64, value in any::<u8>()) {
        let hello = Frame::Hello(shoal_mesh::proto::frames::Hello {
            cluster_id: "cluster".into(),
            node: "node-a".into(),
            generation: 1_700_000_000_000_000,
        });
        let mut body = encode(&hello).unwrap();
        let i = flip % body.len();
        body[i] = value;
        if let Ok(frame) = decode(&body) {
            // Only a valid current-version frame may come out.
            prop_assert!(matches!(frame, Frame::Bye | Frame::Hello(_) | Frame::Update(_)));
        }
        prop_assert_eq!(FRAME_VERSION, 2);
    }
}
