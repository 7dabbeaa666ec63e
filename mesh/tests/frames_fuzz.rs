#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Arbitrary bytes never panic the frame decoder and never decode into a
//! frame of another wire version.

use proptest::prelude::*;
use shoal_mesh::proto::frames::{FRAME_VERSION, Frame, decode, encode};
use shoal_mesh::proto::slot_pack::{self, BasisChange, SlotChange};

fn basis() -> impl Strategy<Value = BasisChange> {
    prop_oneof![
        Just(BasisChange::Same),
        any::<u64>().prop_map(BasisChange::Absolute),
        any::<u64>().prop_map(BasisChange::Later),
    ]
}

fn slot_change() -> impl Strategy<Value = SlotChange> {
    let field = || prop::option::of(prop_oneof![0u64..300, any::<u64>()]);
    (any::<u32>(), field(), field(), field(), field(), basis()).prop_map(
        |(id, requests, tokens, pending_prefill, dispatched_since_poll, basis)| SlotChange {
            id,
            requests,
            tokens,
            pending_prefill,
            dispatched_since_poll,
            basis,
        },
    )
}

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
            prop_assert!(matches!(
                frame,
                Frame::Bye
                    | Frame::Hello(_)
                    | Frame::Update(_)
                    | Frame::Speaks(_)
                    | Frame::Packed(_)
                    | Frame::Tenants(_)
            ));
        }
        prop_assert_eq!(FRAME_VERSION, 2);
    }

    /// Packed slot changes read back as what was packed, whatever the ids
    /// (in any order) and values.
    #[test]
    fn packed_changes_round_trip(changes in prop::collection::vec(slot_change(), 0..64)) {
        let mut bytes = Vec::new();
        slot_pack::pack(&changes, &mut bytes);
        prop_assert_eq!(slot_pack::unpack(&bytes).unwrap(), changes);
    }

    /// Arbitrary bytes as packed changes: an error or changes that pack
    /// back to the same bytes' meaning, never a panic.
    #[test]
    fn random_packed_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(changes) = slot_pack::unpack(&bytes) {
            let mut again = Vec::new();
            slot_pack::pack(&changes, &mut again);
            prop_assert_eq!(slot_pack::unpack(&again).unwrap(), changes);
        }
    }
}
