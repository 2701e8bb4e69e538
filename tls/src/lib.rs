//! TLS as the node, the control plane, the tests and the bench serve and speak it: rustls with
//! ring, TLS 1.2 and 1.3 only.
//!
//! - [`Certificate`]: a served certificate that can be replaced while serving (SIGHUP, or the
//!   files changing); new connections get the new one, open ones go on.
//! - [`validity`]: when a certificate is valid, and due for renewal.
//! - [`server_stream`]: a server's TLS stream that holds no buffer while idle.
//! - [`client_config`]: a client that trusts only the roots it is given; [`roots_from_pem`].

mod certificate;
pub mod server_stream;
pub mod validity;

pub use certificate::{Certificate, TlsError};

use std::sync::Arc;

/// A TLS client (ring; TLS 1.2 and 1.3) that trusts only `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Every certificate in a PEM text, as roots to trust (none if it holds none).
pub fn roots_from_pem(pem: &str) -> rustls::RootCertStore {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).flatten() {
        let _ = roots.add(der);
    }
    roots
}
