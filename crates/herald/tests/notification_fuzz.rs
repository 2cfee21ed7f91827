//! Bounded fuzzing of the notification decoder: any bytes from the queue
//! are decoded or refused, never a panic; every encoding decodes back.

use herald::{EventId, Notification};
use proptest::prelude::*;

fn notification() -> impl Strategy<Value = Notification> {
    (
        any::<String>(),
        proptest::collection::vec(any::<u128>(), 1..20),
    )
        .prop_map(|(tenant, ids)| {
            let mut event_ids: Vec<EventId> = ids
                .into_iter()
                .map(|n| EventId(uuid::Uuid::from_u128(n)))
                .collect();
            // The decoder keeps each id once, in its first place.
            let mut seen = std::collections::HashSet::new();
            event_ids.retain(|id| seen.insert(*id));
            Notification { tenant, event_ids }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Notification::decode(&bytes);
    }

    /// Near misses of the wire form: the right keys with wrong values,
    /// extra keys, both forms at once, truncations.
    #[test]
    fn json_shaped_garbage_never_panics(
        text in r#"\{("(tenant|event_id|event_ids|x)": ?(null|true|-?[0-9]{1,20}(\.[0-9]+)?|"[^"]{0,40}"|\[("[0-9a-f-]{0,40}",?){0,3}\]|\{\}),? ?){0,4}\}?"#
    ) {
        let _ = Notification::decode(text.as_bytes());
    }

    #[test]
    fn every_encoding_decodes_back(n in notification()) {
        let bytes = n.encode();
        prop_assert_eq!(Notification::decode(&bytes).unwrap(), n.clone());
        // Exact for two ids or more, an upper bound for one (publishers
        // bound their messages by it).
        let len = Notification::encoded_len(&n.tenant, n.event_ids.len());
        if n.event_ids.len() >= 2 {
            prop_assert_eq!(bytes.len(), len);
        } else {
            prop_assert!(bytes.len() <= len);
        }
    }

    /// A prefix of a valid encoding is refused, not half-read.
    #[test]
    fn a_cut_encoding_is_refused(n in notification(), cut in any::<prop::sample::Index>()) {
        let bytes = n.encode();
        let end = cut.index(bytes.len());
        prop_assert!(Notification::decode(&bytes[..end]).is_err());
    }
}

/// Found by the fuzzing: tenant names may hold quotes and backslashes,
/// which JSON escapes, and the size bound took them as one byte each, so a
/// publisher could build a message over its byte limit.
#[test]
fn the_size_bound_counts_a_tenants_escapes() {
    let ids = vec![EventId::new(), EventId::new()];
    for tenant in [r#"a"b"#, r"a\b", r#""\""#, "ünï", "acme"] {
        let n = Notification {
            tenant: tenant.into(),
            event_ids: ids.clone(),
        };
        assert_eq!(
            n.encode().len(),
            Notification::encoded_len(tenant, 2),
            "{tenant}"
        );
        let one = Notification::one(tenant, ids[0]);
        assert!(
            one.encode().len() <= Notification::encoded_len(tenant, 1),
            "{tenant}"
        );
    }
}
