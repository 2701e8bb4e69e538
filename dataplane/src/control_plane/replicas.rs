//! The control plane's replicas as the node reaches them, and which one it talks to now.
//!
//! The control plane may run as several replicas on one shared state: each answers every node
//! route, and a watch's `?after=V` means the same on all of them. So the node talks to one
//! replica at a time, the preferred one first, and moves on to the next (round robin) when the
//! one it talks to cannot be reached, does not answer in time, or answers 5xx. A call tries
//! each replica at most once ([`ControlPlanes::call`]); its caller backs off only when a whole
//! round failed.
//!
//! The channel and the reporter share one [`ControlPlanes`]: once either finds a replica gone,
//! both talk to the next one.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An error from one replica: whether the next one may do better.
pub trait Failover {
    /// True when the replica is what failed (it could not be reached, did not answer in time,
    /// or answered 5xx); false for what every replica would say (a 4xx: a credential refused,
    /// a request it does not take).
    fn try_next(&self) -> bool;
}

/// Every replica's base URL, and the one requests go to now. Cheap to clone: clones share
/// which one that is.
#[derive(Clone)]
pub struct ControlPlanes {
    /// Base URLs without a trailing `/`, the preferred first, each once; never empty.
    urls: Arc<[String]>,
    /// The index in `urls` of the replica requests go to now.
    current: Arc<AtomicUsize>,
}

/// The replica a request went to: what [`ControlPlanes::failed`] moves on from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica<'a> {
    index: usize,
    pub url: &'a str,
}

/// Why no replica answered a request with a 2xx.
#[derive(Debug, thiserror::Error)]
pub enum Unanswered {
    #[error("sending: {0}")]
    Send(#[from] reqwest::Error),
    #[error("the control plane replied {0}")]
    Refused(reqwest::StatusCode),
}

impl Failover for Unanswered {
    fn try_next(&self) -> bool {
        match self {
            // Not reached, a connection that broke (a replica stopped mid-watch), a timeout.
            Unanswered::Send(_) => true,
            Unanswered::Refused(status) => status.is_server_error(),
        }
    }
}

impl ControlPlanes {
    /// `preferred` first, then each of `others` not listed yet, in their order.
    pub fn new(preferred: &str, others: &[String]) -> ControlPlanes {
        let mut urls: Vec<String> = Vec::with_capacity(1 + others.len());
        for url in std::iter::once(preferred).chain(others.iter().map(String::as_str)) {
            let url = url.trim_end_matches('/');
            if !urls.iter().any(|listed| listed == url) {
                urls.push(url.to_string());
            }
        }
        ControlPlanes {
            urls: urls.into(),
            current: Arc::default(),
        }
    }

    /// Every replica, the preferred first.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn preferred(&self) -> &str {
        &self.urls[0]
    }

    /// The replica requests go to now.
    pub fn current(&self) -> Replica<'_> {
        let index = self.current.load(Ordering::Relaxed);
        Replica {
            index,
            url: &self.urls[index],
        }
    }

    /// `replica` failed: requests go to the one after it from now on. If another request moved
    /// on from it already, that move stands (two requests failing on one replica skip one
    /// replica, not two); each move is logged once.
    pub fn failed(&self, replica: Replica<'_>) {
        let next = (replica.index + 1) % self.urls.len();
        if next == replica.index {
            return;
        }
        let moved = self.current.compare_exchange(
            replica.index,
            next,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if moved.is_ok() {
            tracing::info!(from = %replica.url, to = %self.urls[next], "failing over to another control plane replica");
        }
    }

    /// `send`'s answer from the current replica, or, while replicas fail in a way the next may
    /// not ([`Failover::try_next`]), from the next ones, each tried once. `send` gets the
    /// replica's base URL. Without an answer, the last error: the caller backs off before
    /// another round.
    pub async fn call<T, E, F, Fut>(&self, mut send: F) -> Result<T, E>
    where
        E: Failover,
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut tries = self.urls.len();
        loop {
            let replica = self.current();
            match send(replica.url.to_string()).await {
                Ok(answer) => return Ok(answer),
                Err(error) if error.try_next() => {
                    self.failed(replica);
                    tries -= 1;
                    if tries == 0 {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The response to what `request` builds for a replica's base URL, as [`Self::call`] goes
    /// through them; a status other than 2xx is an error.
    pub async fn send(
        &self,
        request: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Unanswered> {
        self.call(|base| {
            let sent = request(&base).send();
            async move {
                let response = sent.await?;
                match response.status() {
                    status if status.is_success() => Ok(response),
                    status => Err(Unanswered::Refused(status)),
                }
            }
        })
        .await
    }
}

/// The same replicas, wherever each stands now.
impl PartialEq for ControlPlanes {
    fn eq(&self, other: &ControlPlanes) -> bool {
        self.urls == other.urls
    }
}

impl Eq for ControlPlanes {}

impl std::fmt::Debug for ControlPlanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.urls.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// What a fake replica says: down (the next may answer) or a refusal any would give.
    #[derive(Debug, PartialEq)]
    enum Fake {
        Down,
        Refused,
    }

    impl Failover for Fake {
        fn try_next(&self) -> bool {
            *self == Fake::Down
        }
    }

    fn three() -> ControlPlanes {
        ControlPlanes::new(
            "https://cp1/",
            &["https://cp2".into(), "https://cp3".into()],
        )
    }

    #[test]
    fn the_preferred_comes_first_and_each_replica_once() {
        let listed = ControlPlanes::new(
            "https://cp2:8443/",
            &[
                "https://cp1:8443".into(),
                "https://cp2:8443".into(),
                "https://cp1:8443/".into(),
            ],
        );
        assert_eq!(listed.urls(), ["https://cp2:8443", "https://cp1:8443"]);
        assert_eq!(listed.current().url, "https://cp2:8443");
        let alone = ControlPlanes::new("http://127.0.0.1:1", &[]);
        assert_eq!(alone.urls(), ["http://127.0.0.1:1"]);
        assert_eq!(alone, ControlPlanes::new("http://127.0.0.1:1/", &[]));
    }

    #[test]
    fn a_failure_moves_to_the_next_round_robin_and_clones_follow() {
        let replicas = three();
        let clone = replicas.clone();
        let mut seen = vec![];
        for _ in 0..4 {
            let replica = replicas.current();
            seen.push(replica.url.to_string());
            replicas.failed(replica);
        }
        assert_eq!(
            seen,
            ["https://cp1", "https://cp2", "https://cp3", "https://cp1"]
        );
        assert_eq!(
            clone.current().url,
            "https://cp2",
            "one state for every clone"
        );
        let alone = ControlPlanes::new("https://cp", &[]);
        alone.failed(alone.current());
        assert_eq!(alone.current().url, "https://cp");
    }

    #[test]
    fn two_failures_on_one_replica_move_once() {
        let replicas = three();
        let (channel, reporter) = (replicas.current(), replicas.current());
        replicas.failed(channel);
        replicas.failed(reporter);
        assert_eq!(replicas.current().url, "https://cp2");
    }

    /// Runs `call` against replicas that answer as `answers` says (by base URL; any other
    /// answers with its own URL); returns the result and the URLs tried, in order.
    async fn call_with(
        replicas: &ControlPlanes,
        answers: &[(&str, Fake)],
    ) -> (Result<String, Fake>, Vec<String>) {
        let tried = Mutex::new(vec![]);
        let result = replicas
            .call(|base| {
                tried.lock().unwrap().push(base.clone());
                let answer = match answers.iter().find(|(url, _)| *url == base) {
                    Some((_, Fake::Down)) => Err(Fake::Down),
                    Some((_, Fake::Refused)) => Err(Fake::Refused),
                    None => Ok(base),
                };
                async move { answer }
            })
            .await;
        (result, tried.into_inner().unwrap())
    }

    #[tokio::test]
    async fn a_call_goes_on_to_the_next_replica_and_stays_there() {
        let replicas = three();
        let (answer, tried) = call_with(&replicas, &[("https://cp1", Fake::Down)]).await;
        assert_eq!(answer, Ok("https://cp2".into()));
        assert_eq!(tried, ["https://cp1", "https://cp2"]);
        let (_, tried) = call_with(&replicas, &[]).await;
        assert_eq!(
            tried,
            ["https://cp2"],
            "the next call starts where the last answered"
        );
    }

    #[tokio::test]
    async fn a_call_tries_each_replica_once_then_gives_the_last_error() {
        let replicas = three();
        replicas.failed(replicas.current());
        let all_down = [
            ("https://cp1", Fake::Down),
            ("https://cp2", Fake::Down),
            ("https://cp3", Fake::Down),
        ];
        let (answer, tried) = call_with(&replicas, &all_down).await;
        assert_eq!(answer, Err(Fake::Down));
        assert_eq!(tried, ["https://cp2", "https://cp3", "https://cp1"]);
        assert_eq!(
            replicas.current().url,
            "https://cp2",
            "the next round starts where this one did"
        );
    }

    #[tokio::test]
    async fn a_refusal_every_replica_would_give_is_not_a_failover() {
        let replicas = three();
        let (answer, tried) = call_with(&replicas, &[("https://cp1", Fake::Refused)]).await;
        assert_eq!(answer, Err(Fake::Refused));
        assert_eq!(tried, ["https://cp1"]);
        assert_eq!(replicas.current().url, "https://cp1");
    }

    #[test]
    fn only_unreachable_slow_or_5xx_replicas_are_failed_over() {
        let status = |code: u16| Unanswered::Refused(reqwest::StatusCode::from_u16(code).unwrap());
        assert!(status(503).try_next());
        assert!(status(500).try_next());
        assert!(!status(401).try_next());
        assert!(!status(404).try_next());
    }
}
