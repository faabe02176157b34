//! Static bearer tokens for tests with credentials: the secret each seed
//! stands for, and a tokens file naming their digests.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest as _, Sha256};

/// The token a seed character stands for (a valid `tgk_` secret).
pub fn secret(seed: char) -> String {
    format!("tgk_{}", seed.to_string().repeat(43))
}

/// One token: (id, seed, tenant, subject, scopes).
pub type Token<'a> = (&'a str, char, &'a str, &'a str, &'a [&'a str]);

/// Writes a private tokens file holding `tokens`' digests.
pub fn tokens_file(path: &Path, tokens: &[Token<'_>]) {
    let mut text = String::new();
    for (id, seed, tenant, subject, scopes) in tokens {
        let digest = Sha256::digest(secret(*seed).as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let scopes: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
        text += &format!(
            "[[token]]\nid = {id:?}\nhash = \"sha256:{hex}\"\ntenant = {tenant:?}\nsubject = {subject:?}\nscopes = [{}]\n\n",
            scopes.join(", ")
        );
    }
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
