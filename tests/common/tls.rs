//! A test certificate authority and a server certificate it signed for
//! 127.0.0.1 (rcgen on the ring provider), for the TLS listener's tests and
//! for an HTTPS upstream.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio_rustls::rustls::pki_types::CertificateDer;

/// What [`issue`] wrote and made.
pub struct Issued {
    /// The server's certificate and key (0600), as PEM files.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The authority's certificate as a PEM file, for a client's trust.
    pub ca_pem: PathBuf,
    pub ca: CertificateDer<'static>,
    pub leaf: CertificateDer<'static>,
}

/// A new authority and a certificate for 127.0.0.1 signed by it, written
/// in `dir` as `tls.crt`, `tls.key` and `ca.pem`; the certificate file is
/// replaced in one rename (`tag` names its temporary), so a daemon
/// reloading it never reads half of it.
pub fn issue(dir: &Path, tag: &str) -> Issued {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let (cert_path, key_path, ca_pem) =
        (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.pem"));
    std::fs::write(dir.join(format!("tls.crt.{tag}")), leaf.pem()).unwrap();
    std::fs::rename(dir.join(format!("tls.crt.{tag}")), &cert_path).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    Issued {
        cert: cert_path,
        key: key_path,
        ca_pem,
        ca: ca.der().clone(),
        leaf: leaf.der().clone(),
    }
}
