//! Reading a credential file: a regular file, owned by root or by the
//! service user, never writable by others, and — when it holds secrets —
//! never readable by others either. Each problem refuses like the state
//! directory's (77); a file that is missing or too large is a
//! configuration problem (78).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::AuthError;

/// Largest credential file read: far above any real tokens, revocations or
/// JWKS file, and small enough to hold in memory without a thought.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// What a file holds, which decides how private it must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// Hashes of secrets or a shared secret: no access for others, no
    /// group write.
    Secrets,
    /// Public keys or revocations: readable by anyone, written only by its
    /// owner (whoever could write it could let themselves in, or undo a
    /// revocation).
    Public,
}

/// The file's text, after its permissions were found safe.
pub fn read(path: &Path, what: &'static str, key: &str, holds: Holds) -> Result<String, AuthError> {
    let bytes = read_bytes(path, what, key, holds)?;
    String::from_utf8(bytes).map_err(|_| AuthError::Invalid {
        path: path.to_path_buf(),
        message: format!("the {what} is not UTF-8 text"),
    })
}

/// The file's bytes, after its permissions were found safe.
pub fn read_bytes(
    path: &Path,
    what: &'static str,
    key: &str,
    holds: Holds,
) -> Result<Vec<u8>, AuthError> {
    let file = std::fs::File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            AuthError::Missing {
                what,
                path: path.to_path_buf(),
                key: key.to_string(),
            }
        } else {
            AuthError::Unreadable {
                what,
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    // Checked on the open file, so that what was checked is what is read.
    let meta = file.metadata().map_err(|source| AuthError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let unsafe_ = |why: String| AuthError::Unsafe {
        what,
        path: path.to_path_buf(),
        why,
    };
    if !meta.is_file() {
        return Err(unsafe_("is not a regular file".into()));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(unsafe_(format!(
            "is owned by uid {}, neither root nor this process (uid {euid}); chown it to root",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    let forbidden = match holds {
        Holds::Secrets => 0o027,
        Holds::Public => 0o022,
    };
    if mode & forbidden != 0 {
        let advice = match holds {
            Holds::Secrets => "chmod 0640 (root:taskgate) or 0600",
            Holds::Public => "chmod 0644 or stricter",
        };
        return Err(unsafe_(format!(
            "has mode {mode:04o}, open to other users; {advice}"
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(AuthError::Invalid {
            path: path.to_path_buf(),
            message: format!(
                "the {what} is {} bytes, over the {MAX_FILE_BYTES}-byte limit",
                meta.len()
            ),
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| AuthError::Unreadable {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(AuthError::Invalid {
            path: path.to_path_buf(),
            message: format!("the {what} grew past the {MAX_FILE_BYTES}-byte limit while read"),
        });
    }
    Ok(bytes)
}
