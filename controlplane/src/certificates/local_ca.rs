//! A certificate authority of the control plane's own, for running the whole path on one
//! machine without an ACME CA (`controlplane dev` without Pebble). Clients trust it by its
//! root, `ca.pem` in its directory; nothing else does, so it is for local use only.

use super::{CertificateError, Issued};
use crate::unix_now as now;
use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, Issuer, KeyPair};
use sha2::Digest;
use std::path::{Path, PathBuf};

/// How long a certificate it issues is valid: a public CA's 90 days, so renewal is the same.
const VALID_DAYS: u64 = 90;

pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    /// The root clients must trust (PEM).
    pub root_pem: PathBuf,
    /// `local-ca` and a digest of the root: another root is another CA.
    pub name: String,
}

impl LocalCa {
    /// The CA kept in `dir` (`ca.pem`, and `ca-key.pem` readable by its owner only), made
    /// there the first time.
    pub fn open(dir: &Path) -> Result<LocalCa, CertificateError> {
        let fail = |what: &dyn std::fmt::Display| {
            CertificateError::LocalCa(format!("{}: {what}", dir.display()))
        };
        let (root_pem, key_pem) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        if !root_pem.exists() {
            std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
            let key = KeyPair::generate().map_err(|e| fail(&e))?;
            let made = CertifiedIssuer::self_signed(ca_params(), key).map_err(|e| fail(&e))?;
            // The key first: a root without its key would be no use.
            crate::write_private(&key_pem, made.key().serialize_pem().as_bytes())
                .map_err(|e| fail(&e))?;
            std::fs::write(&root_pem, made.pem()).map_err(|e| fail(&e))?;
        }
        let key = std::fs::read_to_string(&key_pem).map_err(|e| fail(&e))?;
        let key = KeyPair::from_pem(&key).map_err(|e| fail(&e))?;
        // The root was made from these same parameters and this key, so what it signs names
        // the root as its issuer (by name and key identifier).
        let issuer = Issuer::new(ca_params(), key);
        let root = std::fs::read(&root_pem).map_err(|e| fail(&e))?;
        let digest = sha2::Sha256::digest(&root);
        let name = format!(
            "local-ca {}",
            base64::engine::general_purpose::STANDARD.encode(digest)
        );
        Ok(LocalCa {
            issuer,
            root_pem,
            name,
        })
    }

    /// A new certificate for `name` (the cluster's wildcard), valid from yesterday for
    /// [`VALID_DAYS`].
    pub fn issue(&self, name: &str) -> Result<Issued, CertificateError> {
        let fail = |e: rcgen::Error| CertificateError::LocalCa(e.to_string());
        let key = KeyPair::generate().map_err(fail)?;
        let leaf = leaf_params(name)?
            .signed_by(&key, &self.issuer)
            .map_err(fail)?;
        Ok(Issued {
            chain_pem: leaf.pem(),
            key_pem: key.serialize_pem(),
            issued_at: now(),
            issuer: self.name.clone(),
        })
    }
}

impl LocalCa {
    /// A certificate for `name` with the key of `csr` (a node's; the key stays there): only
    /// the CSR's public key is used, the name and validity are ours.
    pub fn sign(
        &self,
        name: &str,
        mut csr: rcgen::CertificateSigningRequestParams,
    ) -> Result<String, CertificateError> {
        csr.params = leaf_params(name)?;
        let leaf = csr
            .signed_by(&self.issuer)
            .map_err(|e| CertificateError::LocalCa(e.to_string()))?;
        Ok(leaf.pem())
    }
}

/// A leaf for `name`, valid from yesterday's midnight for [`VALID_DAYS`].
fn leaf_params(name: &str) -> Result<CertificateParams, CertificateError> {
    let mut params = CertificateParams::new(vec![name.to_string()])
        .map_err(|e| CertificateError::LocalCa(e.to_string()))?;
    let today = now() / 86_400;
    let midnight = |days: u64| {
        let (year, month, day) = qe_shared::calendar::civil_from_days(days);
        rcgen::date_time_ymd(year as i32, month as u8, day as u8)
    };
    params.not_before = midnight(today - 1);
    params.not_after = midnight(today + VALID_DAYS - 1);
    Ok(params)
}

/// What the root says of itself.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "The Queue Expert local CA");
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_kept_and_its_certificates_last_ninety_days() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::open(dir.path()).unwrap();
        let root = std::fs::read_to_string(&ca.root_pem).unwrap();
        let issued = ca.issue("*.q.dev.example.test").unwrap();
        let (from, to) = qe_tls::validity::validity_of_pem(&issued.chain_pem).unwrap();
        assert_eq!((to - from) / 86_400, VALID_DAYS);
        assert!(from <= now() && now() < to);
        assert_eq!(verify(&root, &issued, "q1.q.dev.example.test"), Ok(()));
        assert!(verify(&root, &issued, "q1.q.other.example.test").is_err());
        let again = LocalCa::open(dir.path()).unwrap();
        assert_eq!(again.name, ca.name, "the same CA");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(LocalCa::open(other.path()).unwrap().name, ca.name);
        assert_eq!(issued.issuer, ca.name);
        let reissued = again.issue("*.q.dev.example.test").unwrap();
        assert_eq!(
            verify(&root, &reissued, "q2.q.dev.example.test"),
            Ok(()),
            "the kept CA signs"
        );
        assert_eq!(
            std::fs::read_to_string(&again.root_pem).unwrap(),
            root,
            "the same root"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// Whether `issued` is a valid certificate for `host` to a client that trusts only `root`.
    fn verify(root: &str, issued: &Issued, host: &str) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(root.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(issued.chain_pem.as_bytes()).unwrap();
        let name = ServerName::try_from(host.to_string()).unwrap();
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }
}
