//! A quorum queue's snapshot as a leader sends it to a follower: the state machine's snapshot
//! and the entries the leader still keeps below it.
//!
//! A queue's snapshot releases its log only up to its oldest live message: the bodies of the
//! messages it names are in the entries from there to the snapshot's index. A follower that
//! installed the snapshot alone would name messages it cannot read (and its consumers would
//! starve on them). So the snapshot travels with those entries, and the follower writes them
//! into its log below the snapshot, as the leader has them.
//!
//! Past a size the entries do not travel inside the snapshot: it names their range, and the
//! follower fetches them in chunks ([`crate::catch_up`]).
//!
//! Layout: `MAGIC`, the machine's snapshot (u64 length, bytes), the term of the index before
//! the first entry (u64), the entry count (u64), then each entry as stored (u32 length, the
//! serialised raft `Entry`). Little endian. With `MAGIC_FETCH` instead, after the term: the
//! first and last index of the entries to fetch (u64 each).

use protobuf::Message as _;
use raft::eraftpb::Entry;

const MAGIC: &[u8; 8] = b"wsnap\0\0\x01";
const MAGIC_FETCH: &[u8; 8] = b"wsnap\0\0\x02";

/// A snapshot as it travels.
#[derive(Debug, Default, PartialEq)]
pub struct Carried {
    pub machine: Vec<u8>,
    /// The term of the index before the first entry, where the follower's log starts.
    pub prev_term: u64,
    /// Serialised raft entries, contiguous, ending at the snapshot's index.
    pub entries: Vec<bytes::Bytes>,
    /// The first and last index of the entries to fetch, when they are not carried.
    pub fetch: Option<(u64, u64)>,
}

impl Carried {
    pub fn encode(&self) -> Vec<u8> {
        let entry_bytes: usize = self.entries.iter().map(|e| e.len() + 4).sum();
        let mut out = Vec::with_capacity(MAGIC.len() + 24 + self.machine.len() + entry_bytes);
        out.extend_from_slice(if self.fetch.is_some() {
            MAGIC_FETCH
        } else {
            MAGIC
        });
        out.extend_from_slice(&(self.machine.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.machine);
        out.extend_from_slice(&self.prev_term.to_le_bytes());
        if let Some((first, last)) = self.fetch {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
            return out;
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.len() as u32).to_le_bytes());
            out.extend_from_slice(e);
        }
        out
    }

    /// The snapshot in `data`; data without the envelope is a machine snapshot alone (a
    /// leader that kept no entries below it, or one from before this format).
    pub fn decode(data: &[u8]) -> Result<Carried, String> {
        let (mut rest, fetched) = match (
            data.strip_prefix(MAGIC.as_slice()),
            data.strip_prefix(MAGIC_FETCH.as_slice()),
        ) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => {
                return Ok(Carried {
                    machine: data.to_vec(),
                    ..Default::default()
                })
            }
        };
        let machine_len = take_u64(&mut rest)? as usize;
        let machine = take(&mut rest, machine_len)?.to_vec();
        let prev_term = take_u64(&mut rest)?;
        if fetched {
            let (first, last) = (take_u64(&mut rest)?, take_u64(&mut rest)?);
            if !rest.is_empty() || first > last {
                return Err("a damaged snapshot range".into());
            }
            return Ok(Carried {
                machine,
                prev_term,
                entries: Vec::new(),
                fetch: Some((first, last)),
            });
        }
        let count = take_u64(&mut rest)?;
        let mut entries = Vec::new();
        for _ in 0..count {
            let len = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
            entries.push(bytes::Bytes::copy_from_slice(take(
                &mut rest,
                len as usize,
            )?));
        }
        if !rest.is_empty() {
            return Err(format!("{} bytes after a snapshot's entries", rest.len()));
        }
        Ok(Carried {
            machine,
            prev_term,
            entries,
            fetch: None,
        })
    }

    /// The carried entries with their indexes and terms, checked to be contiguous.
    pub fn parsed(&self) -> Result<Vec<(u64, u64, bytes::Bytes)>, String> {
        let mut out = Vec::with_capacity(self.entries.len());
        for bytes in &self.entries {
            let e = Entry::parse_from_bytes(bytes).map_err(|e| e.to_string())?;
            if let Some((last, _, _)) = out.last() {
                if e.index != last + 1 {
                    return Err(format!(
                        "a snapshot's entries jump from {last} to {}",
                        e.index
                    ));
                }
            }
            out.push((e.index, e.term, bytes.clone()));
        }
        Ok(out)
    }
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err("a snapshot ends early".into());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_u64(rest: &mut &[u8]) -> Result<u64, String> {
    Ok(u64::from_le_bytes(
        take(rest, 8)?.try_into().expect("8 bytes"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> bytes::Bytes {
        let e = Entry {
            index,
            term,
            data: vec![index as u8; 3].into(),
            ..Default::default()
        };
        e.write_to_bytes().unwrap().into()
    }

    #[test]
    fn a_snapshot_with_entries_comes_back_as_it_went() {
        let c = Carried {
            machine: b"state".to_vec(),
            prev_term: 4,
            entries: vec![entry(8, 4), entry(9, 5)],
            fetch: None,
        };
        let back = Carried::decode(&c.encode()).unwrap();
        assert_eq!(back, c);
        let parsed = back.parsed().unwrap();
        assert_eq!(
            parsed.iter().map(|(i, t, _)| (*i, *t)).collect::<Vec<_>>(),
            vec![(8, 4), (9, 5)]
        );
    }

    #[test]
    fn a_snapshot_naming_entries_to_fetch_comes_back_as_it_went() {
        let c = Carried {
            machine: b"state".to_vec(),
            prev_term: 4,
            entries: Vec::new(),
            fetch: Some((8, 9000)),
        };
        let bytes = c.encode();
        assert_eq!(Carried::decode(&bytes).unwrap(), c);
        assert!(Carried::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_bare_machine_snapshot_is_read_as_one_without_entries() {
        let back = Carried::decode(b"{\"plain\":1}").unwrap();
        assert_eq!(back.machine, b"{\"plain\":1}");
        assert!(back.entries.is_empty());
    }

    #[test]
    fn damaged_snapshots_are_refused_not_misread() {
        let c = Carried {
            machine: b"state".to_vec(),
            prev_term: 1,
            entries: vec![entry(2, 1), entry(4, 1)],
            fetch: None,
        };
        let bytes = c.encode();
        assert!(Carried::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Carried::decode(&longer).is_err());
        assert!(Carried::decode(&bytes).unwrap().parsed().is_err(), "a gap");
    }
}
