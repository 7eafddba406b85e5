//! The format of a node's data directories, so that a build never reads data it does not
//! understand.
//!
//! A node writes `format.json` in its metadata directory at its first start. A build refuses
//! to start on data whose format is newer than it reads (a downgrade after a newer build wrote
//! it) with a message that says which build to run, rather than misread the WAL, the segments
//! or the snapshots. A change that older builds cannot read raises [`FORMAT`]; data of an older
//! format is read, and rewritten forward only once every file a build writes is of the new one.
//! Builds from before this file existed wrote format 1 without saying so: a data directory
//! without the file is taken to be format 1.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The data format this build writes.
pub const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct FormatFile {
    format: u32,
    /// The build that wrote it, for the refusal's message.
    #[serde(default)]
    written_by: String,
}

/// Checks the format of the data under `meta_dir` (writing it at a first start): `Err` with
/// what to do when this build cannot read it.
pub fn check(meta_dir: &Path) -> Result<(), String> {
    let path = meta_dir.join("format.json");
    match std::fs::read(&path) {
        Ok(bytes) => {
            let found: FormatFile = serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: {e}: this file says which data format the node's directories hold",
                    path.display()
                )
            })?;
            if found.format > FORMAT {
                return Err(format!(
                    "the data directories hold data format {} (written by warren {}), and this \
                     build (warren {}) reads up to format {FORMAT}: run that build or a newer \
                     one, or restore a backup taken before the upgrade; nothing was read or \
                     changed",
                    found.format,
                    if found.written_by.is_empty() {
                        "?"
                    } else {
                        &found.written_by
                    },
                    env!("CARGO_PKG_VERSION")
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(meta_dir)
                .map_err(|e| format!("{}: {e}", meta_dir.display()))?;
            let file = FormatFile {
                format: FORMAT,
                written_by: env!("CARGO_PKG_VERSION").to_string(),
            };
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&file).expect("serialises"))
                .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(|e| format!("{}: {e}", path.display()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_start_writes_the_format_and_a_newer_one_is_refused_untouched() {
        let dir = std::env::temp_dir().join(format!("warren-format-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        check(&dir).unwrap();
        check(&dir).unwrap();
        let written: FormatFile =
            serde_json::from_slice(&std::fs::read(dir.join("format.json")).unwrap()).unwrap();
        assert_eq!(written.format, FORMAT);
        let newer = format!(r#"{{"format": {}, "written_by": "9.9.9"}}"#, FORMAT + 1);
        std::fs::write(dir.join("format.json"), &newer).unwrap();
        let e = check(&dir).unwrap_err();
        assert!(e.contains("9.9.9") && e.contains("nothing was read"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join("format.json")).unwrap(),
            newer
        );
        std::fs::write(dir.join("format.json"), b"garbage").unwrap();
        assert!(check(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
