//! Digests: owners, creation references, request identities and
//! bindings are stored only in this form, never raw.

use sha2::{Digest as _, Sha256};
use taskgate_store_engine::hex;

/// A sha256 digest. Owners, creation references and request identities are
/// stored only in this form, never raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// A digest of several parts, each length-prefixed so that
    /// ("ab","c") and ("a","bc") differ.
    pub fn of_parts(parts: &[&[u8]]) -> Digest {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        Digest(h.finalize().into())
    }

    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parts_are_unambiguous() {
        assert_ne!(
            Digest::of_parts(&[b"ab", b"c"]),
            Digest::of_parts(&[b"a", b"bc"])
        );
    }
}
