//! Reading a WAL file's records back in order: recovery's replay, and the rescan of an adopted
//! file whose sidecar is damaged.
//!
//! WAL files are recycled (see `wal`): a settled file is renamed to a later sequence and written
//! over from its start, because overwriting blocks a file already has makes each `fdatasync`
//! cheaper than growing the file. Past the records of its current life then lie whole, valid
//! records of its previous one. So every batch of a version 3 file ends with a
//! [`RecordKind::BatchEnd`] record that names the file, the batch's first byte and the checksum
//! of the batch's records, and this reader hands out a batch only once that record vouches for
//! it. The first batch without one ends the file: torn by a crash before its sync finished, or
//! left from an earlier life. The batch checksum also rejects a torn batch whose missing pages
//! show an earlier life's records that happen to line up with the new ones.
//!
//! Version 2 files (written before recycling, never recycled) are read record by record.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use crate::config::{PAYLOAD_BYTES_MAX, RECOVERY_READ_BYTES};
use crate::record::{decode, payload_len, Decoded, RecordHeader, RecordKind, RECORD_HEADER_BYTES};
use crate::wal::{self, WAL_HEADER_BYTES};
use crate::Result;

/// One verified record of a WAL file.
pub(crate) struct ReadRecord {
    pub header: RecordHeader,
    /// Where the record starts in the file.
    pub offset: u64,
    /// The payload, except an append's: replay and rescans need only an entry's length, and
    /// copying every message out of the file would double recovery's memory traffic.
    pub payload: Bytes,
}

pub(crate) struct WalReader<'a> {
    reader: BufReader<&'a File>,
    seq: u64,
    version: u32,
    /// The next byte to read.
    offset: u64,
    /// The end of the records handed out so far: where the file's valid content ends.
    end: u64,
    batch: Vec<ReadRecord>,
    rec: Vec<u8>,
    /// Why reading stopped before the end of the file, once it has.
    stopped: Option<&'static str>,
    done: bool,
}

impl<'a> WalReader<'a> {
    /// A reader of WAL file `seq`, or `None` when its header is not that file's (torn while the
    /// file was created, or not a WAL file).
    pub fn open(file: &'a File, seq: u64) -> Result<Option<WalReader<'a>>> {
        let mut h = [0u8; WAL_HEADER_BYTES as usize];
        match file.read_exact_at(&mut h, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let Some(version) = wal::header_version(&h, seq) else {
            return Ok(None);
        };
        let mut reader = BufReader::with_capacity(RECOVERY_READ_BYTES, file);
        reader.seek(SeekFrom::Start(WAL_HEADER_BYTES))?;
        Ok(Some(WalReader {
            reader,
            seq,
            version,
            offset: WAL_HEADER_BYTES,
            end: WAL_HEADER_BYTES,
            batch: Vec::new(),
            rec: Vec::new(),
            stopped: None,
            done: false,
        }))
    }

    /// The file format's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Where the records handed out so far end.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Why reading stopped before the end of the file: a torn or corrupt record, or a batch
    /// nothing vouches for. `None` while reading, or when the file ended cleanly.
    pub fn stopped(&self) -> Option<&'static str> {
        self.stopped
    }

    /// The next batch of verified records (one record in a version 2 file); `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<&[ReadRecord]>> {
        self.batch.clear();
        if self.done {
            return Ok(None);
        }
        let batch_start = self.offset;
        let mut crc = 0u32;
        loop {
            let (header, bytes) = match self.read_record()? {
                Next::Record(header, bytes) => (header, bytes),
                Next::End => {
                    if !self.batch.is_empty() {
                        self.stopped = Some("a batch without its end record");
                    }
                    return self.finish();
                }
                Next::Bad(why) => {
                    self.stopped = Some(why);
                    return self.finish();
                }
            };
            let offset = self.offset;
            self.offset += bytes as u64;
            if self.version >= 3 {
                if header.kind == RecordKind::BatchEnd {
                    let vouched = header.log_id == self.seq
                        && header.index == batch_start
                        && header.term == u64::from(crc);
                    if !vouched {
                        self.stopped = Some("a batch of an earlier life of the file, or torn");
                        return self.finish();
                    }
                    self.end = self.offset;
                    return Ok(Some(&self.batch));
                }
                if header.kind == RecordKind::Padding {
                    self.stopped = Some("a record of an earlier format");
                    return self.finish();
                }
                crc = crc32c::crc32c_append(crc, &self.rec[..bytes]);
            }
            let payload = if header.kind == RecordKind::Append {
                Bytes::new()
            } else {
                Bytes::copy_from_slice(&self.rec[RECORD_HEADER_BYTES..bytes])
            };
            self.batch.push(ReadRecord {
                header,
                offset,
                payload,
            });
            if self.version < 3 {
                self.end = self.offset;
                return Ok(Some(&self.batch));
            }
        }
    }

    fn finish(&mut self) -> Result<Option<&[ReadRecord]>> {
        self.done = true;
        self.batch.clear();
        Ok(None)
    }

    /// Reads and verifies the record at `self.offset` into `self.rec`.
    fn read_record(&mut self) -> io::Result<Next> {
        self.rec.resize(RECORD_HEADER_BYTES, 0);
        let n = read_full(&mut self.reader, &mut self.rec)?;
        if n == 0 {
            return Ok(Next::End);
        }
        if n < RECORD_HEADER_BYTES {
            return Ok(Next::Bad("torn record header"));
        }
        let len = payload_len(&self.rec);
        if len > PAYLOAD_BYTES_MAX {
            return Ok(Next::Bad("impossible record length"));
        }
        self.rec.resize(RECORD_HEADER_BYTES + len, 0);
        if read_full(&mut self.reader, &mut self.rec[RECORD_HEADER_BYTES..])? < len {
            return Ok(Next::Bad("torn record payload"));
        }
        Ok(match decode(&self.rec) {
            Decoded::Record(h, _) => Next::Record(h, h.record_bytes()),
            _ => Next::Bad("corrupt record"),
        })
    }
}

/// What the bytes at the reader's offset are.
enum Next {
    /// A verified record, and its size in bytes.
    Record(RecordHeader, usize),
    /// The end of the file.
    End,
    /// Not a record, and why.
    Bad(&'static str),
}

/// Reads as many bytes as the file has, up to `buf.len()`.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::encode;
    use crate::wal::{end_batch, header_of_version};

    /// A file holding `bytes`, and its path (removed on drop of the directory).
    fn file_with(name: &str, bytes: &[u8]) -> (std::path::PathBuf, File) {
        let dir =
            std::env::temp_dir().join(format!("warren-wal-reader-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.wal");
        std::fs::write(&path, bytes).unwrap();
        let file = File::open(&path).unwrap();
        (dir, file)
    }

    /// A batch of appends of log `log` at `indexes`, 100-byte payloads, ended as the writer
    /// ends it when written at `at` of file `seq`.
    fn batch(seq: u64, at: u64, log: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut buf = Vec::new();
        for i in indexes {
            encode(&mut buf, RecordKind::Append, log, i, 1, &[i as u8; 100]);
        }
        end_batch(&mut buf, at, seq);
        buf
    }

    fn appends(file: &File, seq: u64) -> (Vec<(u64, u64)>, u64) {
        let mut reader = WalReader::open(file, seq).unwrap().expect("header");
        let mut got = Vec::new();
        while let Some(batch) = reader.next_batch().unwrap() {
            got.extend(batch.iter().map(|r| (r.header.log_id, r.header.index)));
        }
        (got, reader.end())
    }

    #[test]
    fn an_earlier_life_past_the_new_records_is_not_read() {
        // Life 1, file 1: three batches of log 1, a page each.
        let mut old = header_of_version(1, 3).to_vec();
        for i in 0..3u64 {
            let at = old.len() as u64;
            old.extend(batch(1, at, 1, i * 3 + 1..=i * 3 + 3));
        }
        // Life 2, file 5: one batch of log 2 over the first page.
        let mut new = old.clone();
        new[..32].copy_from_slice(&header_of_version(5, 3));
        let first = batch(5, 32, 2, 1..=3);
        new[32..32 + first.len()].copy_from_slice(&first);
        let (dir, file) = file_with("life", &new);
        assert_eq!(appends(&file, 5), (vec![(2, 1), (2, 2), (2, 3)], 4096));
        // What life 1 reads, for contrast: all of it.
        let (_, old_file) = file_with("life1", &old);
        assert_eq!(appends(&old_file, 1).0.len(), 9);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_torn_batch_showing_an_earlier_life_through_a_hole_is_not_read() {
        // Life 1 and life 2 both write records of the same size at the same offsets; life 2's
        // second record never reached the disk, so life 1's shows through, whole and valid.
        let mut old = header_of_version(1, 3).to_vec();
        old.extend(batch(1, 32, 1, 1..=3));
        let mut new = header_of_version(5, 3).to_vec();
        new.extend(batch(5, 32, 2, 1..=3));
        let record = RECORD_HEADER_BYTES + 100;
        let hole = 32 + record..32 + 2 * record;
        new[hole.clone()].copy_from_slice(&old[hole]);
        let (dir, file) = file_with("hole", &new);
        assert_eq!(appends(&file, 5), (vec![], 32));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn version_2_files_are_read_record_by_record() {
        let mut v2 = header_of_version(3, 2).to_vec();
        for i in 1..=3 {
            encode(&mut v2, RecordKind::Append, 7, i, 1, b"x");
        }
        encode(&mut v2, RecordKind::Padding, 0, 0, 0, &[0; 10]);
        let clean_end = v2.len() as u64;
        v2.extend_from_slice(&[0xAB; 40]); // a torn tail
        let (dir, file) = file_with("v2", &v2);
        let mut reader = WalReader::open(&file, 3).unwrap().expect("header");
        assert_eq!(reader.version(), 2);
        let mut kinds = Vec::new();
        while let Some(batch) = reader.next_batch().unwrap() {
            assert_eq!(batch.len(), 1);
            kinds.push(batch[0].header.kind);
        }
        assert_eq!(kinds.len(), 4);
        assert_eq!(kinds[3], RecordKind::Padding);
        assert_eq!(reader.end(), clean_end);
        assert!(reader.stopped().is_some());
        assert!(
            WalReader::open(&file, 4).unwrap().is_none(),
            "another file's header"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
