//! Reading a log's entries back: each comes from the cache while the WAL writer has it, else
//! from the WAL file or the segment that holds it. The plan is made under the store's lock,
//! the reads after it, so a reader never holds up appends while it waits for the disk.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{READ_ENTRIES_MAX, SEGMENT_FDS_MAX};
use crate::log::Loc;
use crate::record::read_entry_at;
use crate::store::{Entry, Store};
use crate::{segment, Error, Result};

/// Where an entry's bytes are, decided under the lock and read after it.
enum Source {
    Memory(Bytes),
    File(Arc<File>, u64),
    Segment(u32, u64),
}

impl Store {
    /// Reads entry `index`; `None` when released or outside the log. The record's checksum,
    /// log id, index and term are verified right after the read.
    pub fn read(&self, log_id: u64, index: u64) -> Result<Option<Entry>> {
        let mut entries = self.read_range(log_id, index, index + 1, usize::MAX)?;
        Ok(entries.pop())
    }

    /// Reads the entries of `from..to` that are not released, in order, stopping after
    /// [`READ_ENTRIES_MAX`] entries or once `max_bytes` of payload are gathered (always at least
    /// one entry if any).
    pub fn read_range(
        &self,
        log_id: u64,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Entry>> {
        // Between planning and reading, a segment may be compacted away (not found), or a
        // settled WAL file recycled and written over (its records no longer match): the entry
        // has moved, so plan again. Real damage fails every attempt.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.try_read_range(log_id, from, to, max_bytes) {
                Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound && attempts < 4 => {
                    continue
                }
                Err(Error::Corrupt(_)) if attempts < 4 => continue,
                other => return other,
            }
        }
    }

    fn try_read_range(
        &self,
        log_id: u64,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Entry>> {
        let mut plan: Vec<(u64, u64, u32, Source)> = Vec::new();
        {
            let st = self.shared.lock();
            let Some(log) = st.logs.get(&log_id) else {
                return Ok(Vec::new());
            };
            let from = from.max(log.first_index);
            let to = to.min(log.last_index() + 1);
            let mut bytes = 0usize;
            let mut index = from;
            while index < to
                && plan.len() < READ_ENTRIES_MAX
                && (plan.is_empty() || bytes < max_bytes)
            {
                let slot = *log.slot(index).expect("index within the log");
                if !slot.released() {
                    let term = log.term_of(index).expect("index within the log");
                    let source = if let Some(p) = log.cached(index) {
                        Source::Memory(p.clone())
                    } else {
                        match slot.loc() {
                            Loc::Pending { .. } => {
                                return Err(Error::Corrupt(format!(
                                    "log {log_id} entry {index}: pending entry missing from cache"
                                )))
                            }
                            Loc::Wal { seq, offset } => match st.wal_files.get(&seq) {
                                Some(f) => Source::File(f.clone(), u64::from(offset)),
                                None => {
                                    return Err(Error::Corrupt(format!("WAL file {seq} missing")))
                                }
                            },
                            Loc::Segment { id, offset } => match st.seg_files.get(&(log_id, id)) {
                                Some(f) => Source::File(f.clone(), u64::from(offset)),
                                None => Source::Segment(id, u64::from(offset)),
                            },
                        }
                    };
                    bytes += slot.len as usize;
                    plan.push((index, term, slot.len, source));
                }
                index += 1;
            }
        }
        let mut out = Vec::with_capacity(plan.len());
        for (index, term, len, source) in plan {
            let payload = match source {
                Source::Memory(p) => p,
                Source::File(file, offset) => {
                    self.read_file(&file, offset, len, log_id, index, term)?
                }
                Source::Segment(id, offset) => {
                    let file = self.segment_file(log_id, id)?;
                    self.read_file(&file, offset, len, log_id, index, term)?
                }
            };
            out.push(Entry {
                index,
                term,
                payload,
            });
        }
        Ok(out)
    }

    fn read_file(
        &self,
        file: &File,
        offset: u64,
        len: u32,
        log_id: u64,
        index: u64,
        term: u64,
    ) -> Result<Bytes> {
        let (read_term, payload) = read_entry_at(file, offset, len, log_id, index)?;
        if read_term != term {
            return Err(Error::Corrupt(format!(
                "log {log_id} entry {index}: term {read_term} on disk, {term} in the index"
            )));
        }
        Ok(payload)
    }

    fn segment_file(&self, log_id: u64, id: u32) -> Result<Arc<File>> {
        let file = Arc::new(segment::open(&self.shared.config.segment_dir, log_id, id)?);
        let mut st = self.shared.lock();
        if st.seg_files.len() >= SEGMENT_FDS_MAX {
            st.seg_files.clear();
        }
        st.seg_files.insert((log_id, id), file.clone());
        Ok(file)
    }
}
