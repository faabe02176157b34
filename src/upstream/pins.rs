//! The pins file: the capability digests an operator reviewed, one per
//! upstream tool, kept beside the configuration file
//! ([`PINS_FILE_NAME`]) and owned by the operator. `taskgate upstream pin`
//! writes it; the daemon reads it at start and at each reload, and
//! validates it as strictly as the configuration (an unknown key, a
//! malformed digest or a tool pinned twice refuses the start, 78).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::digest;
use crate::exit::{Classify, ExitClass};

pub use crate::config::PINS_FILE_NAME;

/// Largest pins file read.
pub const MAX_PINS_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Most pins one file may hold.
pub const MAX_PINS: usize = 65_536;

#[derive(Debug, Error)]
pub enum PinsError {
    #[error("{path}: cannot read the pins file: {source}; check its permissions")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}; fix it, or pin again with `taskgate upstream pin ALIAS`")]
    Invalid { path: PathBuf, message: String },
    /// Whoever could write the file could approve a changed tool.
    #[error(
        "{path}: the pins file {why}; it must be a regular file owned by root or the service user and writable by its owner only"
    )]
    Unsafe { path: PathBuf, why: String },
    #[error("{path}: cannot write the pins file: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Classify for PinsError {
    fn exit_class(&self) -> ExitClass {
        match self {
            PinsError::Read { source, .. } | PinsError::Write { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                ExitClass::UnsafePath
            }
            PinsError::Read { .. } | PinsError::Write { .. } => ExitClass::Io,
            PinsError::Unsafe { .. } => ExitClass::UnsafePath,
            _ => ExitClass::Config,
        }
    }
}

/// The pins file of a configuration file: beside it.
pub fn path_for(config_file: &Path) -> PathBuf {
    crate::config::pins_file(config_file)
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    pin: Vec<RawPin>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    upstream: String,
    tool: String,
    digest: String,
    /// When it was pinned (RFC 3339); for the reader only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pinned: Option<String>,
    /// The description reviewed, as JSON text: what `upstream show`
    /// compares a changed tool with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reviewed: Option<String>,
}

/// The reviewed digests, by upstream alias and the upstream's own tool name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    digests: BTreeMap<(String, String), Pin>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pin {
    digest: String,
    pinned: Option<String>,
    reviewed: Option<String>,
}

impl Pins {
    /// Reads the pins file; a missing file holds no pins.
    pub fn load(path: &Path) -> Result<Pins, PinsError> {
        let invalid = |message: String| PinsError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Pins::default()),
            Err(source) => {
                return Err(PinsError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        // Checked on the open file, so that what was checked is what is read.
        let unsafe_ = |why: String| PinsError::Unsafe {
            path: path.to_path_buf(),
            why,
        };
        let meta = file.metadata().map_err(|source| PinsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        {
            use std::os::unix::fs::MetadataExt;
            let euid = nix::unistd::geteuid().as_raw();
            if !meta.is_file() {
                return Err(unsafe_("is not a regular file".into()));
            }
            if meta.uid() != 0 && meta.uid() != euid {
                return Err(unsafe_(format!("is owned by uid {}", meta.uid())));
            }
            if meta.mode() & 0o022 != 0 {
                return Err(unsafe_(format!(
                    "is writable by others (mode {:o})",
                    meta.mode() & 0o7777
                )));
            }
        }
        let mut text = String::new();
        use std::io::Read as _;
        file.take(MAX_PINS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|source| PinsError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        if text.len() as u64 > MAX_PINS_FILE_BYTES {
            return Err(invalid(format!("larger than {MAX_PINS_FILE_BYTES} bytes")));
        }
        let raw: RawFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if raw.pin.len() > MAX_PINS {
            return Err(invalid(format!(
                "{} pins; at most {MAX_PINS} are allowed",
                raw.pin.len()
            )));
        }
        let mut pins = Pins::default();
        for p in raw.pin {
            if !digest::is_digest(&p.digest) {
                return Err(invalid(format!(
                    "[[pin]] {}.{}: digest {:?} is not sha256: and 64 lower-case hex digits",
                    p.upstream, p.tool, p.digest
                )));
            }
            let key = (p.upstream.clone(), p.tool.clone());
            if pins.digests.contains_key(&key) {
                return Err(invalid(format!(
                    "[[pin]] {}.{} appears twice; keep one",
                    p.upstream, p.tool
                )));
            }
            pins.digests.insert(
                key,
                Pin {
                    digest: p.digest,
                    pinned: p.pinned,
                    reviewed: p.reviewed,
                },
            );
        }
        Ok(pins)
    }

    /// The pinned digest of an upstream's tool, if it has one.
    pub fn get(&self, upstream: &str, tool: &str) -> Option<&str> {
        self.digests
            .get(&(upstream.to_string(), tool.to_string()))
            .map(|p| p.digest.as_str())
    }

    /// The pins of one upstream, by tool (what a reload compares).
    pub fn of(&self, upstream: &str) -> Vec<(&str, &str)> {
        self.digests
            .iter()
            .filter(|((u, _), _)| u == upstream)
            .map(|((_, t), p)| (t.as_str(), p.digest.as_str()))
            .collect()
    }

    /// Whether any tool of `upstream` is pinned.
    pub fn any_for(&self, upstream: &str) -> bool {
        self.digests.keys().any(|(u, _)| u == upstream)
    }

    /// The aliases that have pins, for `check` to name pins of an
    /// upstream no longer configured.
    pub fn upstreams(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.digests.keys().map(|(u, _)| u.as_str()).collect();
        out.dedup();
        out
    }

    /// Pins `tool` of `upstream` to `digest`, replacing any earlier pin;
    /// `reviewed` is the description the operator saw.
    pub fn set(
        &mut self,
        upstream: &str,
        tool: &str,
        digest: &str,
        when: String,
        reviewed: Option<&serde_json::Value>,
    ) {
        self.digests.insert(
            (upstream.to_string(), tool.to_string()),
            Pin {
                digest: digest.to_string(),
                pinned: Some(when),
                reviewed: reviewed.map(|v| v.to_string()),
            },
        );
    }

    /// The description reviewed when `tool` of `upstream` was pinned.
    pub fn reviewed(&self, upstream: &str, tool: &str) -> Option<serde_json::Value> {
        self.digests
            .get(&(upstream.to_string(), tool.to_string()))
            .and_then(|p| p.reviewed.as_deref())
            .and_then(|t| serde_json::from_str(t).ok())
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Writes the file whole and in place of the old one (a new file,
    /// synced, renamed over it), keeping the old file's permissions, 0644
    /// for a new one: a reader never sees half a file.
    pub fn write(&self, path: &Path) -> Result<(), PinsError> {
        let failed = |source: std::io::Error| PinsError::Write {
            path: path.to_path_buf(),
            source,
        };
        let raw = RawFile {
            pin: self
                .digests
                .iter()
                .map(|((upstream, tool), p)| RawPin {
                    upstream: upstream.clone(),
                    tool: tool.clone(),
                    digest: p.digest.clone(),
                    pinned: p.pinned.clone(),
                    reviewed: p.reviewed.clone(),
                })
                .collect(),
        };
        let body = toml::to_string(&raw).map_err(|e| failed(std::io::Error::other(e)))?;
        let text = format!(
            "# Reviewed capabilities of taskgate's upstream MCP servers, written by\n# `taskgate upstream pin`. A tool whose live digest differs from its pin\n# is withheld from callers until it is reviewed and pinned again.\n\n{body}"
        );
        // The old file's mode, never writable by others (a new file: 0644).
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7755)
            .unwrap_or(0o644);
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut nonce = [0u8; 8];
        let _ = getrandom::fill(&mut nonce);
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!(".{PINS_FILE_NAME}.{nonce}.tmp"));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            std::fs::File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PINS_FILE_NAME);
        assert!(Pins::load(&path).unwrap().is_empty());
        let mut pins = Pins::default();
        let d = digest::of_value(&serde_json::json!({"a": 1}));
        pins.set("files", "search", &d, "2026-01-01T00:00:00Z".into(), None);
        pins.write(&path).unwrap();
        let back = Pins::load(&path).unwrap();
        assert_eq!(back.get("files", "search"), Some(d.as_str()));
        assert_eq!(back.get("files", "other"), None);

        // Writable by others: whoever could write it could approve a tool.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Pins::load(&path).unwrap_err();
        assert_eq!(e.exit_class(), ExitClass::UnsafePath, "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

        for (text, says) in [
            (
                "[[pin]]\nupstream = \"a\"\ntool = \"t\"\ndigest = \"md5:00\"\n",
                "digest",
            ),
            ("[[pin]]\nupstream = \"a\"\ntool = \"t\"\n", "digest"),
            (
                "[[pin]]\nupstream = \"a\"\ntool = \"t\"\ndigest = \"x\"\nextra = 1\n",
                "extra",
            ),
            (
                &format!(
                    "[[pin]]\nupstream = \"a\"\ntool = \"t\"\ndigest = \"{d}\"\n[[pin]]\nupstream = \"a\"\ntool = \"t\"\ndigest = \"{d}\"\n"
                ),
                "twice",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = Pins::load(&path).unwrap_err();
            assert!(e.to_string().contains(says), "{text}: {e}");
            assert_eq!(e.exit_class(), ExitClass::Config);
        }
    }
}
