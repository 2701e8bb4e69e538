//! What every command starts from: the config file, the profile chosen, the output format;
//! and how a profile turns into a control-plane client and a queue's [`Endpoint`].

use crate::config::{Config, Profile, QueueLogins};
use crate::failure::Failure;
use crate::output::Format;
use qe_client::{ControlPlane, Credentials, Endpoint, Error, Role};
use std::path::PathBuf;
use std::time::Duration;
use url::Host;

/// The config file, the profile in use and the output format.
pub struct Context {
    /// Where the config file is.
    pub path: PathBuf,
    /// Its contents (saved by commands that change them).
    pub config: Config,
    /// The profile in use.
    pub profile_name: String,
    /// How to print.
    pub format: Format,
    /// How long a call to the control plane may take (`--timeout`).
    pub api_within: Duration,
}

/// How long connecting to the API or a queue may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

impl Context {
    /// The profile in use; a usage error if the file has none of that name.
    pub fn profile(&self) -> Result<&Profile, Failure> {
        self.config.profiles.get(&self.profile_name).ok_or_else(|| {
            Failure::Usage(format!(
                "no profile {:?} in {}: `qe login --api URL --token-stdin` writes one",
                self.profile_name,
                self.path.display()
            ))
        })
    }

    /// The profile in use, to change (then [`Context::save`]).
    pub fn profile_mut(&mut self) -> Result<&mut Profile, Failure> {
        self.profile()?;
        Ok(self
            .config
            .profiles
            .get_mut(&self.profile_name)
            .expect("checked"))
    }

    /// Writes the config file.
    pub fn save(&self) -> Result<(), Failure> {
        self.config.save(&self.path)
    }

    /// The extra roots of the profile, read.
    fn roots(&self) -> Result<Option<String>, Failure> {
        match &self.profile()?.ca {
            Some(path) => std::fs::read_to_string(path)
                .map(Some)
                .map_err(|e| Failure::Usage(format!("the profile's ca {}: {e}", path.display()))),
            None => Ok(None),
        }
    }

    /// A client of the profile's control plane.
    pub fn api(&self) -> Result<ControlPlane, Failure> {
        let profile = self.profile()?;
        let (Some(api), Some(token)) = (&profile.api, &profile.token) else {
            return Err(Failure::Usage(format!(
                "profile {:?} has no control plane: `qe login --api URL --token-stdin`",
                self.profile_name
            )));
        };
        let mut builder = ControlPlane::builder(api, token.clone()).timeout(self.api_within);
        if let Some(pem) = self.roots()? {
            builder = builder.add_root_certificates_pem(&pem)?;
        }
        Ok(builder.build()?)
    }

    /// The queue's saved logins, if any.
    pub fn saved(&self, queue: &str) -> Option<&QueueLogins> {
        self.profile().ok()?.queues.get(queue)
    }

    /// The queue's address: the control plane's answer (it knows where the node is now),
    /// else the one saved in the profile.
    pub async fn queue_url(&self, queue: &str) -> Result<String, Failure> {
        let saved = self.saved(queue).and_then(|q| q.url.clone());
        let has_api = self.profile()?.api.is_some();
        if !has_api {
            return saved.ok_or_else(|| {
                Failure::NotFound(format!(
                    "no queue {queue} in profile {:?}, and no control plane to ask",
                    self.profile_name
                ))
            });
        }
        match self.api()?.queue(queue).await {
            Ok(found) => Ok(found.url),
            // The API is out of reach, but the queue may not be.
            Err(Error::Http(_) | Error::Timeout(_)) if saved.is_some() => {
                Ok(saved.expect("checked"))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The login of `role` for `queue`; a usage error naming how to add it.
    pub fn login(&self, queue: &str, role: Role) -> Result<Credentials, Failure> {
        self.saved(queue)
            .and_then(|q| q.login(role))
            .cloned()
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "no {} login for queue {queue} in profile {:?}: `qe queues login {queue} \
                     --role {} --username NAME --password-stdin` adds it",
                    role.name(),
                    self.profile_name,
                    role.name()
                ))
            })
    }

    /// Where to reach `queue`: its URL, the profile's roots, and, with the profile's `dns`,
    /// the addresses that server gives for its name (kept for TLS).
    pub async fn endpoint(&self, queue: &str) -> Result<Endpoint, Failure> {
        let url = self.queue_url(queue).await?;
        // The queue's own max-ws-msg-len decides (an administrator may have raised it to
        // 1 MiB, or lowered it): the library learns it at each login (`"limits":true`), and
        // refuses a bigger frame before sending it, which exits 3 as a refusal.
        let mut endpoint = Endpoint::new(&url)?.connect_timeout(CONNECT_WITHIN);
        if let Some(pem) = self.roots()? {
            endpoint = endpoint.add_root_certificates_pem(&pem)?;
        }
        if let Some(server) = &self.profile()?.dns {
            if let Some(Host::Domain(name)) = endpoint.url().host() {
                let port = endpoint.url().port_or_known_default().unwrap_or(443);
                let addrs = crate::dns::resolve(server, name, port).await?;
                endpoint = endpoint.connect_to(addrs);
            }
        }
        Ok(endpoint)
    }
}
