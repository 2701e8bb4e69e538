//! Pebble, Let's Encrypt's test CA (Debian package `pebble`), run as the ACME CA for
//! `controlplane dev` and the tests. It validates DNS-01 against *our* DNS server
//! (`-dnsserver`); it is never told to skip validation.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// How long Pebble may take to serve its directory.
const START_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

pub struct Pebble {
    _child: Child,
    /// The ACME directory URL.
    pub directory: String,
    /// The CA of Pebble's own HTTPS listener (PEM file), for ACME clients to trust.
    pub listener_ca: PathBuf,
    /// Pebble's management API (it serves the issuing root).
    management: String,
    client: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum PebbleError {
    #[error("pebble: {0}")]
    Io(#[from] std::io::Error),
    #[error("pebble's listener certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("pebble exited before it served its directory; see {0}")]
    Exited(PathBuf),
    #[error("pebble did not serve its directory within {0:?}")]
    Slow(std::time::Duration),
    #[error("pebble's issuing root: {0}")]
    Root(String),
    #[error("pebble's listeners did not answer as pebble (a port taken meanwhile?): {0}")]
    NotListening(String),
}

/// How many times Pebble is started on fresh ports when one of its ports was taken between our
/// choosing it and Pebble binding it (tests running beside it pick ports too).
const ATTEMPTS: usize = 3;

/// Whether `pebble` is on the PATH.
pub fn installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("pebble").is_file()))
}

impl Pebble {
    /// Starts Pebble with its files in `dir` (its log is `dir/pebble.log`), sending its DNS-01
    /// lookups to `dns`; returns once both its listeners answer. It stops when this is dropped.
    pub async fn start(dns: SocketAddr, dir: &Path) -> Result<Pebble, PebbleError> {
        let mut attempt = 1;
        loop {
            match Pebble::start_once(dns, dir).await {
                Err(PebbleError::NotListening(why)) if attempt < ATTEMPTS => {
                    tracing::warn!("pebble, attempt {attempt}: {why}; starting it on other ports");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(dns: SocketAddr, dir: &Path) -> Result<Pebble, PebbleError> {
        std::fs::create_dir_all(dir)?;
        let listener_ca = dir.join("listener-ca.pem");
        let ca_pem = listener_certificate(dir)?;
        std::fs::write(&listener_ca, &ca_pem)?;
        let (acme, management) = (free_port()?, free_port()?);
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{acme}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.join("listener.pem"),
            "privateKey": dir.join("listener-key.pem"),
            "httpPort": free_port()?,
            "tlsPort": free_port()?,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        let config_path = dir.join("pebble.json");
        std::fs::write(&config_path, config.to_string())?;
        let log_path = dir.join("pebble.log");
        let mut child = Command::new("pebble")
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &dns.to_string()])
            // No random waits; no refused nonces; every order validated afresh.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path)?)
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut log = tokio::fs::File::create(dir.join("pebble.out")).await?;
        let serving = async {
            loop {
                let Some(line) = lines.next_line().await? else {
                    return Err(PebbleError::Exited(log_path.clone()));
                };
                log.write_all(format!("{line}\n").as_bytes()).await?;
                if line.contains("ACME directory available") {
                    return Ok(());
                }
            }
        };
        match tokio::time::timeout(START_WITHIN, serving).await {
            Ok(served) => served?,
            Err(_) => return Err(PebbleError::Slow(START_WITHIN)),
        }
        // Pebble says where it listens just before its listeners take their sockets.
        for port in [acme, management] {
            accepting(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        }
        // The rest of what it says goes to its log, so it never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(format!("{line}\n").as_bytes()).await;
            }
        });
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(std::sync::Arc::unwrap_or_clone(qe_tls::client_config(
                qe_tls::roots_from_pem(&ca_pem),
            )))
            .build()
            .map_err(|e| PebbleError::Root(e.to_string()))?;
        let pebble = Pebble {
            _child: child,
            directory: format!("https://127.0.0.1:{acme}/dir"),
            listener_ca,
            management: format!("https://127.0.0.1:{management}"),
            client,
        };
        // A port taken by another process between `free_port` and Pebble's bind makes Pebble
        // exit while `accepting` sees the other process: only an answer over TLS with our
        // listener certificate proves both listeners are Pebble's.
        let roots = format!("{}/roots/0", pebble.management);
        for url in [&pebble.directory, &roots] {
            pebble
                .client
                .get(url)
                .send()
                .await
                .and_then(|response| response.error_for_status())
                .map_err(|e| PebbleError::NotListening(format!("{url}: {}", chain(&e))))?;
        }
        Ok(pebble)
    }

    /// The root that issues certificates now, in PEM. It changes at every start of Pebble.
    pub async fn issuing_root(&self) -> Result<String, PebbleError> {
        let fail = |e: reqwest::Error| PebbleError::Root(chain(&e));
        let url = format!("{}/roots/0", self.management);
        let response = self.client.get(url).send().await.map_err(fail)?;
        let text = response
            .error_for_status()
            .map_err(fail)?
            .text()
            .await
            .map_err(fail)?;
        match text.find("-----BEGIN CERTIFICATE") {
            Some(start) => Ok(text[start..].to_string()),
            None => Err(PebbleError::Root("no PEM certificate".into())),
        }
    }
}

/// Returns once `addr` takes TCP connections, or fails after [`START_WITHIN`]. (Pebble gives no
/// sign of that: this polls.)
async fn accepting(addr: SocketAddr) -> Result<(), PebbleError> {
    let deadline = tokio::time::Instant::now() + START_WITHIN;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if tokio::time::Instant::now() >= deadline {
            return Err(PebbleError::Slow(START_WITHIN));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Makes Pebble's listener certificate (`listener.pem`, `listener-key.pem` in `dir`) for
/// `localhost` and 127.0.0.1, signed by a throwaway CA; returns that CA's PEM. (The Debian
/// package ships none.)
fn listener_certificate(dir: &Path) -> Result<String, PebbleError> {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "Pebble listener CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let leaf = CertificateParams::new(names)?.signed_by(&key, &ca)?;
    std::fs::write(dir.join("listener.pem"), leaf.pem())?;
    crate::write_private(
        &dir.join("listener-key.pem"),
        key.serialize_pem().as_bytes(),
    )?;
    Ok(ca.pem())
}

/// An error with its sources (reqwest's own message names only the request).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A TCP port free on 127.0.0.1 now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
