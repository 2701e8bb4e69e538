//! Where a queue is and how to reach it; who logs in.

use crate::error::{Error, Result};
use qe_shared::protocol::MAX_CREDENTIAL_BYTES;
use qe_shared::settings::{Setting, Tier};
use qe_shared::Code;
use rustls::pki_types::CertificateDer;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use url::Url;

/// A queue's address and how to connect to it: TLS roots, compression, timeouts, limits.
///
/// Cheap to clone; every connection made from it (and every reconnection) uses the same
/// settings. Each connection learns the largest frame the queue takes when it logs in
/// ([`FrameLimit`]).
///
/// ```
/// use qe_client::Endpoint;
/// use std::time::Duration;
///
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?
///     .compression(true)
///     .connect_timeout(Duration::from_secs(5));
/// assert_eq!(endpoint.url().host_str(), Some("queue-id.q.cluster.thequeueexpert.com"));
/// assert!(Endpoint::new("https://example.com/").is_err());
/// # Ok::<(), qe_client::Error>(())
/// ```
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) url: Url,
    /// Roots trusted besides Mozilla's (or instead, with `trust_only_added_roots`).
    added_roots: Vec<CertificateDer<'static>>,
    /// Whether Mozilla's roots (webpki-roots) are trusted too.
    public_roots: bool,
    /// The TLS client, made once from the roots above (or given whole).
    tls: Arc<OnceLock<Arc<rustls::ClientConfig>>>,
    /// Offer permessage-deflate (off by default: queue messages are usually small).
    pub(crate) compression: bool,
    /// The connection, TLS, upgrade and login together must take no longer. Default 10 s.
    pub(crate) connect_timeout: Duration,
    /// How each connection limits the frames it sends. Default: learned from the queue at
    /// every login.
    pub(crate) frame_limit: FrameLimit,
    /// A ping goes out after this long without a frame from the queue. Default 15 s.
    pub(crate) ping_every: Duration,
    /// A queue silent this long (not even a pong) is taken as gone. Default 45 s.
    pub(crate) silence_limit: Duration,
    /// Where to connect instead of resolving the URL's host with the system's resolver (a
    /// name only a private DNS server knows); empty: resolve as usual. The URL's host still
    /// names the queue for TLS (SNI, verification) and the `Host` header.
    pub(crate) connect_to: Vec<SocketAddr>,
}

impl Endpoint {
    /// A queue at `url`: `wss://HOST[:PORT]/` (or `ws://` for a node without TLS).
    pub fn new(url: &str) -> Result<Endpoint> {
        let parsed = Url::parse(url).map_err(|e| Error::Connect {
            url: url.to_string(),
            reason: format!("not a URL: {e}"),
        })?;
        if !matches!(parsed.scheme(), "ws" | "wss") || parsed.host().is_none() {
            return Err(Error::Connect {
                url: url.to_string(),
                reason: "a queue's address is ws://HOST/ or wss://HOST/".into(),
            });
        }
        Ok(Endpoint {
            url: parsed,
            added_roots: Vec::new(),
            public_roots: true,
            tls: Arc::default(),
            compression: false,
            connect_timeout: Duration::from_secs(10),
            frame_limit: FrameLimit::Learned,
            ping_every: Duration::from_secs(15),
            silence_limit: Duration::from_secs(45),
            connect_to: Vec::new(),
        })
    }

    /// The address.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Offers permessage-deflate (RFC 7692); the queue accepts it from every client.
    pub fn compression(mut self, on: bool) -> Endpoint {
        self.compression = on;
        self
    }

    /// Also trusts the certificates in a PEM text (a private CA, a local control plane's
    /// `ca.pem`); an error if it holds none.
    pub fn add_root_certificates_pem(mut self, pem: &str) -> Result<Endpoint> {
        use rustls::pki_types::pem::PemObject;
        let before = self.added_roots.len();
        for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let der = der.map_err(|e| Error::Connect {
                url: self.url.to_string(),
                reason: format!("a root certificate that does not read: {e}"),
            })?;
            self.added_roots.push(der);
        }
        if self.added_roots.len() == before {
            return Err(Error::Connect {
                url: self.url.to_string(),
                reason: "no certificate in the PEM text".into(),
            });
        }
        self.tls = Arc::default();
        Ok(self)
    }

    /// Also trusts one certificate, in DER.
    pub fn add_root_certificate_der(mut self, der: impl Into<Vec<u8>>) -> Endpoint {
        self.added_roots.push(CertificateDer::from(der.into()));
        self.tls = Arc::default();
        self
    }

    /// Trusts only the roots added, not Mozilla's.
    pub fn trust_only_added_roots(mut self) -> Endpoint {
        self.public_roots = false;
        self.tls = Arc::default();
        self
    }

    /// Uses this TLS client as it is (its roots, its client certificate, its protocols).
    pub fn tls_config(self, config: Arc<rustls::ClientConfig>) -> Endpoint {
        let tls = OnceLock::new();
        let _ = tls.set(config);
        Endpoint {
            tls: Arc::new(tls),
            ..self
        }
    }

    /// How long the TCP connection, TLS, upgrade and login may take together (10 s unless
    /// given).
    pub fn connect_timeout(mut self, timeout: Duration) -> Endpoint {
        self.connect_timeout = timeout;
        self
    }

    /// Fixes the largest frame to send, instead of learning the queue's `max-ws-msg-len` at
    /// login ([`FrameLimit::Learned`], the default): `Some(n)` refuses a bigger request with
    /// [`Error::TooLarge`] before it is sent, whatever the queue would take; `None` sends any
    /// size, and the queue closes the connection (1009) on one over its limit.
    ///
    /// The same as [`Endpoint::frame_limit`] with [`FrameLimit::Fixed`] or
    /// [`FrameLimit::Unlimited`].
    pub fn max_frame_bytes(self, limit: Option<usize>) -> Endpoint {
        match limit {
            Some(bytes) => self.frame_limit(FrameLimit::Fixed(bytes)),
            None => self.frame_limit(FrameLimit::Unlimited),
        }
    }

    /// How each connection limits the frames it sends: [`FrameLimit::Learned`] (the default)
    /// takes the queue's `max-ws-msg-len` at every login.
    ///
    /// ```
    /// use qe_client::{Endpoint, FrameLimit};
    /// // Back to learning, on an endpoint that had a fixed limit.
    /// let endpoint = Endpoint::new("ws://127.0.0.1:8080/")?
    ///     .max_frame_bytes(Some(8192))
    ///     .frame_limit(FrameLimit::Learned);
    /// # Ok::<(), qe_client::Error>(())
    /// ```
    pub fn frame_limit(mut self, limit: FrameLimit) -> Endpoint {
        self.frame_limit = limit;
        self
    }

    /// Pings after `ping_every` without a frame from the queue, and takes a queue silent for
    /// `silence_limit` as gone (15 s and 45 s unless given): a connection whose peer vanished
    /// without closing it is noticed, and a subscriber reconnects.
    pub fn heartbeat(mut self, ping_every: Duration, silence_limit: Duration) -> Endpoint {
        self.ping_every = ping_every;
        self.silence_limit = silence_limit.max(ping_every);
        self
    }

    /// Connects to these addresses (in order, the first that answers) instead of resolving the
    /// URL's host name, which still names the queue for TLS (SNI and certificate
    /// verification) and the `Host` header: for a name that resolves only through a DNS
    /// server of your own (a local control plane's `*.q.dev.…` names). An empty list
    /// resolves the name as usual.
    ///
    /// ```
    /// use qe_client::Endpoint;
    /// let endpoint = Endpoint::new("wss://queue-id.q.dev.thequeueexpert.com:8001/")?
    ///     .connect_to(vec!["[::1]:8001".parse().unwrap()]);
    /// assert_eq!(endpoint.url().host_str(), Some("queue-id.q.dev.thequeueexpert.com"));
    /// # Ok::<(), qe_client::Error>(())
    /// ```
    pub fn connect_to(mut self, addrs: Vec<SocketAddr>) -> Endpoint {
        self.connect_to = addrs;
        self
    }

    /// The TLS client for wss:// and the control plane's https://.
    pub(crate) fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls
            .get_or_init(|| tls_client(&self.added_roots, self.public_roots))
            .clone()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field("added_roots", &self.added_roots.len())
            .field("public_roots", &self.public_roots)
            .field("compression", &self.compression)
            .field("connect_timeout", &self.connect_timeout)
            .field("frame_limit", &self.frame_limit)
            .field("connect_to", &self.connect_to)
            .finish_non_exhaustive()
    }
}

/// How a connection limits the frames it sends, so that a request too big for the queue is
/// refused with [`Error::TooLarge`] before it is sent, rather than the queue closing the
/// connection with 1009 (the queue's `max-ws-msg-len`, which an administrator may set from
/// 1,024 to 1,048,576 bytes, counts the whole frame: the JSON around the body too, and a binary
/// body as base64).
///
/// A connection's limit is fixed when it logs in. An administrator who lowers
/// `max-ws-msg-len` meanwhile makes a frame between the two limits close the connection (1009,
/// [`Error::Closed`]); the next connection (a publisher's next request, a subscriber's
/// reconnection) learns the new limit. One who raises it is heard from at the next login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FrameLimit {
    /// The queue's own `max-ws-msg-len`, learned at every login (the login asks with
    /// `"limits":true` and the reply says `"maxwsmsglen"`); 65,536, the queue's default, from a
    /// node too old to say. The default.
    #[default]
    Learned,
    /// This many bytes, whatever the queue takes; nothing is learned.
    Fixed(usize),
    /// No limit: any size is sent, and the queue closes the connection (1009) on a frame over
    /// its `max-ws-msg-len`.
    Unlimited,
}

impl FrameLimit {
    /// The limit a node too old to say its own is taken to have: the queue's default.
    pub const DEFAULT_BYTES: usize = Setting::MaxWsMsgLen.default_for(Tier::Standard) as usize;
}

/// A TLS client (rustls with ring, TLS 1.2 and 1.3) trusting `added` and, if `public`,
/// Mozilla's roots.
pub(crate) fn tls_client(
    added: &[CertificateDer<'static>],
    public: bool,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    if public {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for der in added {
        // A certificate that is no CA is simply never a chain's root.
        let _ = roots.add(der.clone());
    }
    qe_tls::client_config(roots)
}

/// A queue's login for one role: the name and password the control plane showed when the
/// queue was made.
///
/// The password is not shown by `Debug`.
///
/// ```
/// let login = qe_client::Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD");
/// assert!(!format!("{login:?}").contains("PUBLISHER-PASSWORD"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Credentials {
    /// The login's name, up to 128 bytes.
    pub username: String,
    /// Its password, up to 128 bytes.
    pub password: String,
}

impl Credentials {
    /// A name and password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The manual's limits on both (103, 104), checked before connecting.
    pub(crate) fn check(&self) -> Result<()> {
        if self.username.len() > MAX_CREDENTIAL_BYTES {
            return Err(Error::invalid(Code::InvalidUsername));
        }
        if self.password.len() > MAX_CREDENTIAL_BYTES {
            return Err(Error::invalid(Code::InvalidPassword));
        }
        Ok(())
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"…")
            .finish()
    }
}

/// The two queue types that share one address (the manual's "Two queue types").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Distribute,
    Copy,
}

impl Credentials {
    /// The login's fields for `role` on a queue of `kind`.
    pub(crate) fn login(
        &self,
        role: qe_shared::protocol::Role,
        kind: Kind,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut fields = serde_json::Map::new();
        fields.insert("username".into(), self.username.clone().into());
        fields.insert("password".into(), self.password.clone().into());
        fields.insert("role".into(), role.name().into());
        let queue_type = match kind {
            Kind::Distribute => "distribute",
            Kind::Copy => "copy",
        };
        fields.insert("queuetype".into(), queue_type.into());
        fields
    }
}
