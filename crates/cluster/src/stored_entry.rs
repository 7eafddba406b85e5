//! How a Raft entry is kept in the store's log.
//!
//! Most entries are a quorum queue's commands, a message each. Such an entry is stored *bare*:
//! its data is the record's payload as it is (shared, not copied), since the store's record
//! already holds the index and term. Encoding the whole entry with protobuf instead copied every
//! body once more on every member, in the loop that every group's appends go through.
//!
//! Every other entry (a membership change, an entry with a context, data that could be read as
//! protobuf) is stored as the protobuf encoding of the whole entry, as all entries were before.
//! The two cannot be mistaken for each other: a protobuf message starts with a field's tag, and
//! field numbers start at 1, so its first byte is at least 0x08. A payload whose first byte is
//! below that is bare data. Logs written before keep reading back as they were written.
//!
//! What leaves the node as stored entries (a catching-up member's chunks, the entries a
//! snapshot carries) is always protobuf: its receiver learns each entry's index and term from
//! it, and stores it as it came.

use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{Entry, EntryType};

/// Payloads whose first byte is below this are bare data.
const PROTOBUF_FIRST_BYTE_MIN: u8 = 0x08;

fn bare(payload: &[u8]) -> bool {
    payload
        .first()
        .is_some_and(|b| *b < PROTOBUF_FIRST_BYTE_MIN)
}

/// The payload that keeps `e` in the store.
pub fn payload(e: &Entry) -> Bytes {
    if e.get_entry_type() == EntryType::EntryNormal && e.context.is_empty() && bare(&e.data) {
        e.data.clone()
    } else {
        e.write_to_bytes().expect("entries serialise").into()
    }
}

/// The entry a stored record holds. Its data is a slice of `payload`, not a copy.
pub fn entry(index: u64, term: u64, payload: &Bytes) -> Result<Entry, String> {
    if bare(payload) {
        return Ok(Entry {
            index,
            term,
            data: payload.clone(),
            ..Entry::default()
        });
    }
    Entry::parse_from_carllerche_bytes(payload).map_err(|e| e.to_string())
}

/// A stored record as it travels to another member: the protobuf encoding of its entry.
pub fn portable(stored: warren_store::Entry) -> Bytes {
    if !bare(&stored.payload) {
        return stored.payload;
    }
    let e = Entry {
        index: stored.index,
        term: stored.term,
        data: stored.payload,
        ..Entry::default()
    };
    e.write_to_bytes().expect("entries serialise").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(index: u64, data: &'static [u8]) -> Entry {
        Entry {
            index,
            term: 3,
            data: Bytes::from_static(data),
            ..Entry::default()
        }
    }

    #[test]
    fn a_queue_command_is_stored_bare_and_read_back_whole() {
        // A quorum queue's commands start with their kind: 0 (JSON) or 1 (enqueue).
        for data in [&b"\x01enqueue"[..], &b"\x00{}"[..]] {
            let e = Entry {
                index: 9,
                term: 3,
                data: Bytes::copy_from_slice(data),
                ..Entry::default()
            };
            let p = payload(&e);
            assert_eq!(p.as_ptr(), e.data.as_ptr(), "the data itself, not a copy");
            let back = entry(9, 3, &p).unwrap();
            assert_eq!(back, e);
            assert_eq!(back.data.as_ptr(), p.as_ptr());
            // Another member gets what it always got: the entry's protobuf encoding.
            let sent = portable(warren_store::Entry {
                index: 9,
                term: 3,
                payload: p,
            });
            assert_eq!(sent, Bytes::from(e.write_to_bytes().unwrap()));
        }
    }

    #[test]
    fn other_entries_are_stored_as_protobuf_as_before() {
        let change = Entry {
            entry_type: EntryType::EntryConfChangeV2,
            ..normal(4, b"\x01change")
        };
        let with_context = Entry {
            context: Bytes::from_static(b"ctx"),
            ..normal(5, b"\x01x")
        };
        // Data that starts like protobuf (the metadata group's JSON), and no data at all (the
        // empty entry a new leader appends).
        for e in [
            change,
            with_context,
            normal(6, b"{\"a\":1}"),
            normal(7, b""),
        ] {
            let p = payload(&e);
            assert_eq!(p, Bytes::from(e.write_to_bytes().unwrap()));
            assert_eq!(entry(e.index, 3, &p).unwrap(), e);
            let sent = portable(warren_store::Entry {
                index: e.index,
                term: 3,
                payload: p.clone(),
            });
            assert_eq!(sent, p);
        }
    }
}
