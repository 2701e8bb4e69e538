//! The shared backend: an etcd cluster, for several control-plane replicas.
//!
//! etcd gives what the replicas need and nothing of our own has to: linearizable reads and
//! writes committed by a majority, transactions to compare-and-swap on a key's revision,
//! watches to follow other replicas' changes, and leases for leader election
//! ([`crate::leadership`]). Every key is under one prefix (default `/qe/CLUSTER/`).
//!
//! Without a majority etcd answers neither writes nor (linearizable) reads: every request
//! then fails after `timeout_secs` (tried on every member meanwhile) as
//! [`StoreError::Unavailable`], which the API answers `503 unavailable`. Nothing stale is
//! served.

use super::{Backend, EtcdConfig, Fence, Listed, StoreError, Stored, Version};
use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use qe_shared::backoff::Backoff;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Records put in one transaction: etcd refuses one of more operations than its
/// `--max-txn-ops` (default 128), counting those of nested transactions (three each here).
const TXN_OPS_AT_MOST: usize = 32;
/// The longest one member's defragmentation may take (it copies the database file).
const DEFRAGMENT_WITHIN: Duration = Duration::from_secs(300);
/// The most operations etcd takes in one transaction (its `--max-txn-ops`, 128 by default).
const ETCD_TXN_OPS: usize = 128;
/// Keys read per request: well under gRPC's 4 MiB message at a few KiB per record.
const PAGE: i64 = 500;
/// The wait after every member failed a request, before it goes round them again; each wait
/// is twice the one before, up to [`LONGEST_WAIT`] (an etcd election with its default
/// timings takes a second or two).
const FIRST_WAIT: Duration = Duration::from_millis(100);
const LONGEST_WAIT: Duration = Duration::from_secs(1);
/// The wait before a broken watch is made again.
const REWATCH_AFTER: Duration = Duration::from_millis(200);
/// One try of a read or write takes at most this share of `timeout_secs`, and never less than
/// [`SHORTEST_TRY`]: a write in flight when the etcd leader dies is held by the member it went
/// to until its deadline (the proposal is lost with the leader), and must leave time to be
/// sent again once the election is over (about a second with etcd's default timings). With
/// the whole budget for one try, such writes answered 503 (issue 28).
const TRIES_IN_BUDGET: u32 = 3;
const SHORTEST_TRY: Duration = Duration::from_millis(500);

pub struct EtcdBackend {
    /// Balanced over every member, for the watches and the leader's lease, which are made
    /// again when they break.
    client: Client,
    /// One client per member, for reads and writes: a request that fails is sent to the
    /// next member. (tonic's balance picks a member at random for each request, and keeps a
    /// dead one in its pick: a few tries in a row could all reach it.)
    members: Vec<Client>,
    /// The member reads and writes go to, until one fails there.
    current: AtomicUsize,
    /// Stop trying again after this (`timeout_secs`): a majority is lost, not a member.
    give_up_after: Duration,
    /// How long one try may take (a share of `give_up_after`).
    try_within: Duration,
    prefix: String,
    /// Each member's URL, for a client of its own with time for a defragmentation.
    endpoints: Vec<String>,
    /// Its TLS and user, for every client made later (`secured`).
    secured: ConnectOptions,
}

impl From<etcd_client::Error> for StoreError {
    fn from(error: etcd_client::Error) -> StoreError {
        StoreError::Unavailable(error.to_string())
    }
}

/// The options every client of `config`'s etcd starts from: its TLS (the root, and the
/// client's certificate when given) and its user, when configured.
fn secured(config: &EtcdConfig) -> Result<ConnectOptions, StoreError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| StoreError::Config(format!("[store] {}: {e}", path.display())))
    };
    let mut options = ConnectOptions::new();
    if let Some(ca) = &config.ca_file {
        let mut tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        match (&config.cert_file, &config.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::Config(
                    "[store] cert_file and key_file go together".into(),
                ))
            }
        }
        options = options.with_tls(tls);
    } else if config.cert_file.is_some() || config.key_file.is_some() {
        return Err(StoreError::Config(
            "[store] a client certificate needs ca_file (TLS)".into(),
        ));
    }
    match (&config.user, &config.password_file) {
        (Some(user), Some(file)) => {
            let password = String::from_utf8(read(file)?)
                .map_err(|_| StoreError::Config("[store] password_file is not text".into()))?;
            options = options.with_user(user.clone(), password.trim_end().to_string());
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Config(
                "[store] user and password_file go together".into(),
            ))
        }
    }
    Ok(options)
}

impl EtcdBackend {
    pub async fn connect(config: &EtcdConfig, cluster: &str) -> Result<EtcdBackend, StoreError> {
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        let try_within = (timeout / TRIES_IN_BUDGET).max(SHORTEST_TRY).min(timeout);
        let options = secured(config)?
            .with_timeout(timeout)
            .with_connect_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout)
            // A member cut off from the majority refuses at once rather than waiting.
            .with_require_leader(true);
        let client = Client::connect(&config.endpoints, Some(options.clone())).await?;
        // A member's request gives up (on its own deadline too) after one try's share.
        let member_options = options
            .with_timeout(try_within)
            .with_connect_timeout(try_within);
        let mut members = Vec::with_capacity(config.endpoints.len());
        for endpoint in &config.endpoints {
            // (Connected on first use: a member down now is no error yet.)
            members.push(Client::connect([endpoint], Some(member_options.clone())).await?);
        }
        let prefix = config
            .prefix
            .clone()
            .unwrap_or_else(|| format!("/qe/{cluster}/"));
        // Ranges end just past the prefix's last byte.
        if !prefix.ends_with('/') || !prefix.is_ascii() {
            return Err(StoreError::Config(format!(
                "[store] prefix {prefix:?}: ASCII, ending in /"
            )));
        }
        Ok(EtcdBackend {
            client,
            members,
            current: AtomicUsize::new(0),
            give_up_after: timeout,
            try_within,
            prefix,
            endpoints: config.endpoints.clone(),
            secured: secured(config)?,
        })
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn kv(&self) -> etcd_client::KvClient {
        self.members[self.current.load(Ordering::Relaxed)].kv_client()
    }

    /// Every key from `start` to `end` (excluded), read in pages of [`PAGE`] (a gRPC message
    /// is at most 4 MiB) at the first page's revision, and that revision: one consistent
    /// read, however many records there are.
    async fn read_all(
        &self,
        start: String,
        end: String,
    ) -> Result<(Vec<etcd_client::KeyValue>, i64), StoreError> {
        let mut all = Vec::new();
        let (mut from, mut revision) = (start.clone(), 0);
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_revision(revision);
            let mut page = match self.kv().get(from.clone(), Some(options.clone())).await {
                Ok(page) => page,
                // Compacted past the revision the first page was read at: read again from
                // the start at the latest one.
                Err(error) if revision != 0 && error.to_string().contains("compacted") => {
                    (from, revision) = (start.clone(), 0);
                    all.clear();
                    continue;
                }
                Err(_) => self.read(from.clone(), Some(options)).await?,
            };
            if revision == 0 {
                revision = page.header().map(|h| h.revision()).unwrap_or_default();
            }
            let more = page.more();
            all.extend(page.take_kvs());
            match (more, all.last()) {
                // The next page starts just after the last key read.
                (true, Some(last)) => from = format!("{}\0", String::from_utf8_lossy(last.key())),
                _ => return Ok((all, revision)),
            }
        }
    }

    /// Runs `txn`, [`Self::retried`].
    /// Deletes every key from `start` to `end` (excluded).
    fn delete_between(&self, start: &str, end: &str) -> TxnOp {
        let range = etcd_client::DeleteOptions::new().with_range(self.key(end));
        TxnOp::delete(self.key(start), Some(range))
    }

    async fn txn(&self, txn: Txn) -> Result<Attempted<etcd_client::TxnResponse>, StoreError> {
        self.retried(|mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads `key` (with `options`), [`Self::retried`].
    async fn read(
        &self,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        let attempted = self.retried(|mut kv| {
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, options).await }
        });
        Ok(attempted.await?.answer)
    }

    /// Runs `request` on the current member and, if it fails there (or does not answer
    /// within `try_within`), on the next one, which then stays current: a member that died,
    /// or one cut off from the majority, costs one request, not an error. Once every member
    /// has failed it, it waits (longer each time) for an election under way to end (a
    /// follower whose leader just died answers "no leader" or times out) and goes round
    /// again, until `give_up_after` from the start, each try included: a majority lost. An error no retry can mend (a request etcd
    /// refuses as such) is answered at once.
    async fn retried<T, F: std::future::Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        request: impl Fn(etcd_client::KvClient) -> F,
    ) -> Result<Attempted<T>, StoreError> {
        let deadline = Instant::now() + self.give_up_after;
        let mut backoff = Backoff::new(FIRST_WAIT, LONGEST_WAIT);
        let (mut failed_in_round, mut after_failure) = (0, false);
        loop {
            let member = self.current.load(Ordering::Relaxed);
            let left = deadline.saturating_duration_since(Instant::now());
            let this_try = left.min(self.try_within);
            let tried = tokio::time::timeout(this_try, request(self.members[member].kv_client()));
            let error = match tried.await {
                Ok(Ok(answer)) => {
                    return Ok(Attempted {
                        answer,
                        after_failure,
                    })
                }
                Ok(Err(error)) if !worth_retrying(&error) => return Err(error.into()),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {this_try:?}"),
            };
            after_failure = true;
            // The next member is current (unless another request moved on already).
            let next = (member + 1) % self.members.len();
            let _ =
                self.current
                    .compare_exchange(member, next, Ordering::Relaxed, Ordering::Relaxed);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Unavailable(error));
            }
            tracing::info!(%error, member, "an etcd request is tried on the next member");
            failed_in_round += 1;
            if failed_in_round == self.members.len() {
                tokio::time::sleep(backoff.next_wait().min(left)).await;
                failed_in_round = 0;
            }
        }
    }
}

/// A key's value, with the revision that last changed it.
fn stored(kv: &etcd_client::KeyValue) -> Stored {
    Stored {
        value: kv.value().to_vec(),
        version: Version::Revision(kv.mod_revision()),
    }
}

/// A range's values, and the latest revision that changed one (0 for none: the store has
/// revisions all the same).
fn listed(kvs: Vec<etcd_client::KeyValue>) -> Listed {
    let revision = kvs.iter().map(|kv| kv.mod_revision()).max().unwrap_or(0);
    Listed {
        values: kvs.into_iter().map(|kv| kv.into_key_value().1).collect(),
        revision: Some(revision as u64),
    }
}

/// An answer from etcd, and whether a try before it failed. A write whose try failed (timed
/// out, or its member lost before it answered) may have been applied all the same: a retry
/// whose comparison then fails must look whether the first did it, or it would be done twice.
struct Attempted<T> {
    answer: T,
    after_failure: bool,
}

/// Whether another try, maybe on another member, can succeed where `error` failed: the
/// member or its leader out of reach, or no answer in time. Not a request etcd refuses as
/// such (too many operations, a revision compacted away).
fn worth_retrying(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    match error {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Aborted
                | Code::Cancelled
                | Code::Internal
                | Code::ResourceExhausted
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// The comparison a fenced write adds: the leader's key is still the one made at its
/// revision (it goes with the lease).
fn fence_holds(fence: Option<&Fence>) -> Option<Compare> {
    fence.map(|fence| Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.revision))
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let response = self.read(self.key(key), None).await?;
        Ok(response.kvs().first().map(stored))
    }

    async fn range(&self, start: &str, end: &str) -> Result<Listed, StoreError> {
        Ok(listed(
            self.read_all(self.key(start), self.key(end)).await?.0,
        ))
    }

    async fn count(&self, start: &str, end: &str) -> Result<u64, StoreError> {
        let options = GetOptions::new()
            .with_range(self.key(end))
            .with_count_only();
        let counted = self.read(self.key(start), Some(options)).await?;
        Ok(counted.count().max(0) as u64)
    }

    async fn range_first(
        &self,
        start: &str,
        end: &str,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let options = GetOptions::new()
            .with_range(self.key(end))
            .with_limit(limit as i64);
        let page = self.read(self.key(start), Some(options)).await?;
        Ok(page.kvs().iter().map(|kv| kv.value().to_vec()).collect())
    }

    async fn upkeep(
        &self,
        compact_before: Option<i64>,
        defragment_over: i64,
    ) -> Result<Option<super::UpkeepDone>, StoreError> {
        let mut done = super::UpkeepDone::default();
        let mut client = self.client.clone();
        let status = client.status().await?;
        done.revision = status.header().map_or(0, |header| header.revision());
        if let Some(before) = compact_before.filter(|&before| before > 0) {
            // Physical: answered once the space is free in the file, so the look at each
            // member below sees it.
            let physical = etcd_client::CompactionOptions::new().with_physical();
            match client.compact(before, Some(physical)).await {
                Ok(_) => done.compacted_to = Some(before),
                // Compacted already past it (etcd's own auto-compaction): nothing to do.
                Err(error) if error.to_string().contains("compacted") => {}
                Err(error) => return Err(error.into()),
            }
        }
        // Member by member, each with time of its own: a defragmentation blocks the member
        // (reads and writes wait) for as long as it copies its file.
        for (member, endpoint) in self.members.iter().zip(&self.endpoints) {
            let status = member.clone().status().await?;
            let free = status.db_size() - status.raft_used_db_size();
            if free > defragment_over {
                let patient = self
                    .secured
                    .clone()
                    .with_timeout(DEFRAGMENT_WITHIN)
                    .with_connect_timeout(self.try_within);
                let mut member = Client::connect([endpoint], Some(patient)).await?;
                let defragmented = tokio::time::timeout(DEFRAGMENT_WITHIN, member.defragment());
                let defragmented = defragmented.await.map_err(|_| {
                    StoreError::Unavailable("a member's defragmentation took too long".into())
                })?;
                defragmented?;
                done.defragmented += 1;
                done.freed += free;
            }
        }
        Ok(Some(done))
    }

    async fn range_last(&self, start: &str, end: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let options = GetOptions::new()
            .with_range(self.key(end))
            .with_sort(
                etcd_client::SortTarget::Key,
                etcd_client::SortOrder::Descend,
            )
            .with_limit(1);
        let page = self.read(self.key(start), Some(options)).await?;
        Ok(page.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn replace_range(
        &self,
        start: &str,
        end: &str,
        entries: Vec<(String, Vec<u8>)>,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        // etcd refuses a transaction that deletes a range and puts a key in it: the entries
        // are put, and the gaps between them deleted.
        let mut entries = entries;
        entries.sort();
        let ops_needed = 2 * entries.len() + 1;
        if ops_needed > ETCD_TXN_OPS {
            return Err(StoreError::Unavailable(format!(
                "{} records replace a range in one transaction, at most {}",
                entries.len(),
                (ETCD_TXN_OPS - 1) / 2
            )));
        }
        let mut ops = Vec::with_capacity(ops_needed);
        let mut gap_start = start.to_string();
        for (key, value) in entries {
            if gap_start < key {
                ops.push(self.delete_between(&gap_start, &key));
            }
            // The first key after `key`.
            gap_start = format!("{key}\0");
            ops.push(TxnOp::put(self.key(&key), value, None));
        }
        if gap_start.as_str() < end {
            ops.push(self.delete_between(&gap_start, end));
        }
        let compares: Vec<Compare> = fence_holds(fence).into_iter().collect();
        let attempted = self.txn(Txn::new().when(compares).and_then(ops)).await?;
        match attempted.answer.succeeded() {
            true => Ok(()),
            false => Err(StoreError::NotLeader),
        }
    }

    async fn range_and_get(
        &self,
        start: &str,
        end: &str,
        key: &str,
    ) -> Result<(Listed, Option<Stored>), StoreError> {
        let (kvs, revision) = self.read_all(self.key(start), self.key(end)).await?;
        let at = GetOptions::new().with_revision(revision);
        let got = self.read(self.key(key), Some(at)).await?;
        Ok((listed(kvs), got.kvs().first().map(stored)))
    }

    async fn swap(
        &self,
        key: &str,
        expected: Option<&Version>,
        value: Vec<u8>,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        let key = self.key(key);
        let unchanged = match expected {
            Some(Version::Revision(revision)) => {
                Compare::mod_revision(key.clone(), CompareOp::Equal, *revision)
            }
            Some(Version::Value(_)) => unreachable!("etcd's versions are revisions"),
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        };
        let compares: Vec<Compare> = std::iter::once(unchanged)
            .chain(fence_holds(fence))
            .collect();
        let txn =
            Txn::new()
                .when(compares)
                .and_then([TxnOp::put(key.clone(), value.clone(), None)]);
        let Attempted {
            answer: response,
            after_failure,
        } = self.txn(txn).await?;
        if !response.succeeded() && after_failure {
            // A failed try may have made the change that now fails the comparison.
            let now = self.read(key, None).await?;
            if now.kvs().first().is_some_and(|kv| kv.value() == value) {
                return Ok(true);
            }
        }
        if let (false, Some(fence)) = (response.succeeded(), fence) {
            // Lost the race, or the lease: which one decides whether to try again.
            let leader = self.read(fence.key.clone(), None).await?;
            let still = leader
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == fence.revision);
            if !still {
                return Err(StoreError::NotLeader);
            }
        }
        Ok(response.succeeded())
    }

    async fn put_absent(
        &self,
        entries: Vec<(String, Vec<u8>)>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        // One transaction of nested ones, each "put if absent, else read it": one round trip
        // per [`TXN_OPS_AT_MOST`] entries.
        let mut kept = Vec::with_capacity(entries.len());
        for chunk in txn_chunks(&entries) {
            let nested = chunk.iter().map(|(key, value)| {
                let key = self.key(key);
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                        .or_else([TxnOp::get(key, None)]),
                )
            });
            let attempted = self
                .txn(Txn::new().and_then(nested.collect::<Vec<_>>()))
                .await?;
            let answers = attempted.answer.op_responses();
            for ((_, value), answer) in chunk.iter().zip(answers) {
                let TxnOpResponse::Txn(inner) = answer else {
                    unreachable!("every operation is a transaction");
                };
                let found = match inner.succeeded() {
                    true => None,
                    false => Some(match inner.op_responses().first() {
                        Some(TxnOpResponse::Get(get)) => get
                            .kvs()
                            .first()
                            .map(|kv| kv.value().to_vec())
                            .unwrap_or_default(),
                        _ => Vec::new(),
                    }),
                };
                // What a failed try put (it may have been applied) is this put's, not another's.
                let ours = attempted.after_failure && found.as_ref() == Some(value);
                kept.push(if ours { None } else { found });
            }
        }
        Ok(kept)
    }

    async fn dump(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let end = super::end_of(&self.prefix);
        let (kvs, _) = self.read_all(self.prefix.clone(), end).await?;
        let entries = kvs.into_iter().map(|kv| {
            let (key, value) = kv.into_key_value();
            let key = String::from_utf8_lossy(&key);
            let key = key.strip_prefix(&self.prefix).unwrap_or(&key).to_string();
            (key, value)
        });
        Ok(entries.collect())
    }

    fn follow_changes(&self, prefixes: Vec<String>, changed: super::OnChange) {
        for prefix in prefixes {
            let (client, key) = (self.client.clone(), self.key(&prefix));
            tokio::spawn(follow(client, key, self.prefix.clone(), changed.clone()));
        }
    }

    fn etcd(&self) -> Option<(Client, String)> {
        Some((self.client.clone(), self.prefix.clone()))
    }
}

/// `entries` in order, cut into transactions etcd takes: at most [`TXN_OPS_AT_MOST`]
/// operations, and no key twice in one (etcd refuses that; the second then finds the first).
fn txn_chunks(entries: &[(String, Vec<u8>)]) -> Vec<&[(String, Vec<u8>)]> {
    let mut chunks = Vec::new();
    let (mut start, mut keys) = (0, std::collections::HashSet::new());
    for (i, (key, _)) in entries.iter().enumerate() {
        if i - start == TXN_OPS_AT_MOST || !keys.insert(key.as_str()) {
            chunks.push(&entries[start..i]);
            start = i;
            keys = std::collections::HashSet::from([key.as_str()]);
        }
    }
    if start < entries.len() {
        chunks.push(&entries[start..]);
    }
    chunks
}

/// Calls `changed` with each key changed under `prefix` (without the store's prefix,
/// `ours`), for the life of the process. A watch that breaks (its member lost) is made
/// again; `changed(None)` is called then, since changes may have been missed meanwhile.
async fn follow(client: Client, prefix: String, ours: String, changed: super::OnChange) {
    loop {
        let options = WatchOptions::new().with_prefix();
        match client
            .watch_client()
            .watch(prefix.clone(), Some(options))
            .await
        {
            Ok(mut stream) => {
                changed(None);
                while let Ok(Some(response)) = stream.message().await {
                    for event in response.events() {
                        let key = event.kv().map(|kv| String::from_utf8_lossy(kv.key()));
                        match key.as_deref().and_then(|key| key.strip_prefix(&ours)) {
                            Some(key) => changed(Some(key)),
                            None => changed(None),
                        }
                    }
                    // Cancelled by the server (compacted past it): made again.
                    if response.canceled() {
                        break;
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "the store's watch is made again"),
        }
        tokio::time::sleep(REWATCH_AFTER).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_member_out_of_reach_is_worth_a_retry_and_a_refused_request_is_not() {
        let status = |code, text| etcd_client::Error::GRpcStatus(tonic::Status::new(code, text));
        use tonic::Code;
        assert!(super::worth_retrying(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(super::worth_retrying(&status(
            Code::DeadlineExceeded,
            "timed out"
        )));
        for refused in [
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::PermissionDenied,
        ] {
            assert!(
                !super::worth_retrying(&status(refused, "refused")),
                "{refused:?}"
            );
        }
        let bad_arguments = etcd_client::Error::InvalidArgs("too many operations".into());
        assert!(!super::worth_retrying(&bad_arguments));
    }

    #[test]
    fn a_key_twice_or_too_many_operations_start_a_new_transaction() {
        let entry = |key: &str| (key.to_string(), Vec::new());
        let entries = [entry("a"), entry("b"), entry("a"), entry("c")];
        let sizes: Vec<usize> = super::txn_chunks(&entries)
            .iter()
            .map(|c| c.len())
            .collect();
        assert_eq!(sizes, [2, 2]);
        let many: Vec<_> = (0..300).map(|n| entry(&n.to_string())).collect();
        let sizes: Vec<usize> = super::txn_chunks(&many).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [32; 9].into_iter().chain([12]).collect::<Vec<_>>());
        assert!(super::txn_chunks(&[]).is_empty());
    }
}
