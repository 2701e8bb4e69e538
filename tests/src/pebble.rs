//! Pebble, Let's Encrypt's test CA, as a real ACME server for the control plane's DNS-01
//! orders. It validates against *our* DNS server (`-dnsserver`), never `ALWAYS_VALID`.

use rcgen::{CertificateParams, KeyPair};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Pebble {
    child: Child,
    /// The ACME directory URL.
    pub directory: String,
    /// The CA of Pebble's own HTTPS listener (PEM file), for clients to trust.
    pub listener_ca: PathBuf,
    listener_ca_der: rustls::pki_types::CertificateDer<'static>,
    management: SocketAddr,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Pebble {
    /// Starts Pebble, sending its DNS-01 lookups to `dns`.
    pub fn start(dns: SocketAddr) -> Pebble {
        let dir = tempfile::tempdir().unwrap();
        let ca = crate::test_ca("Pebble listener CA for tests");
        let key = KeyPair::generate().unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let leaf = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.path().join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        let listener_ca = dir.path().join("listener-ca.pem");
        std::fs::write(&listener_ca, ca.pem()).unwrap();
        let (acme, management) = (free_port(), free_port());
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{acme}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": free_port(),
            "tlsPort": free_port(),
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let mut child = Command::new("pebble")
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &dns.to_string()])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble (apt-get install pebble; ./scripts/test does)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "pebble exited");
            if line.contains("ACME directory available") {
                break;
            }
        }
        std::thread::spawn(move || for _ in stdout.lines() {});
        Pebble {
            child,
            directory: format!("https://127.0.0.1:{acme}/dir"),
            listener_ca,
            listener_ca_der: ca.der().clone(),
            management: format!("127.0.0.1:{management}").parse().unwrap(),
            _dir: dir,
        }
    }

    /// The root that issues certificates now (it changes at every start), as DER.
    pub async fn issuing_root(&self) -> rustls::pki_types::CertificateDer<'static> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.listener_ca_der.clone()).unwrap();
        let connector = tokio_rustls::TlsConnector::from(crate::tls_client_config(roots));
        let tcp = tokio::net::TcpStream::connect(self.management)
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(b"GET /roots/0 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        let text = String::from_utf8_lossy(&response);
        let pem = &text[text.find("-----BEGIN").expect("a PEM root")..];
        let mut reader = std::io::Cursor::new(pem.as_bytes());
        rustls_pemfile_der(&mut reader)
    }
}

/// The first certificate in a PEM text.
fn rustls_pemfile_der(
    reader: &mut dyn std::io::BufRead,
) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    let mut text = String::new();
    std::io::Read::read_to_string(reader, &mut text).unwrap();
    rustls::pki_types::CertificateDer::from_pem_slice(text.as_bytes()).unwrap()
}

impl Drop for Pebble {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
