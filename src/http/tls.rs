//! TLS for a listener that is not on loopback: rustls with a certificate
//! chain and key read from PEM files, swapped whole on reload (a renewed
//! certificate needs no restart; connections already open keep the one
//! they began with).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use thiserror::Error;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::exit::{Classify, ExitClass};

/// Largest certificate chain or key file read.
const MAX_PEM_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read the TLS {what} {path}: {detail}")]
    Read {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("the TLS {what} {path} is not usable: {detail}")]
    Invalid {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
}

impl Classify for TlsError {
    fn exit_class(&self) -> ExitClass {
        match self {
            TlsError::Read { .. } => ExitClass::Io,
            TlsError::Invalid { .. } => ExitClass::Config,
        }
    }
}

/// The certificate and key in force, replaced on reload.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads and checks the pair (the key must match the certificate).
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        Ok(Tls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(Arc::new(server_config(cert, key)?)),
        })
    }

    /// Reads the files again (their paths as at start); on any error the
    /// pair in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new(server_config(&self.cert, &self.key)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// An acceptor for one new connection, with the pair in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let err = |e: std::io::Error| TlsError::Read {
        what,
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(err)?
        .take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::Invalid {
            what,
            path: path.to_path_buf(),
            detail: format!("larger than {MAX_PEM_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let invalid = |what, path: &Path, detail: String| TlsError::Invalid {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(cert, "certificate chain")?)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid("certificate chain", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(invalid(
            "certificate chain",
            cert,
            "no CERTIFICATE block".into(),
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&read(key, "private key")?)
        .map_err(|e| invalid("private key", key, e.to_string()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("certificate chain", cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            invalid(
                "private key",
                key,
                format!("{e} (does it match the certificate?)"),
            )
        })
        .map(|mut c| {
            // HTTP/1.1 only, as the plain listener.
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            c
        })
}
