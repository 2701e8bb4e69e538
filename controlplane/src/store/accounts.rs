//! Accounts, their API keys and the audit log in the store.
//!
//! - `accounts/ID`: an [`Account`], changed only by compare-and-swap;
//! - `api-keys/KEYID`: an [`ApiKey`], found by the id a presented key carries (one read,
//!   however many keys there are); `account-keys/ACCOUNT/KEYID` lists an account's keys;
//! - `audit/CURSOR` and `audit-by-account/ACCOUNT/CURSOR`: each [`Entry`], written once under
//!   both, so that the log is read in time order for everyone and for one account alike
//!   without reading the other accounts' entries.

use super::{end_of, Store, StoreError};
use crate::model::account::{Account, ApiKey};
use crate::model::audit::Entry;
use serde::de::DeserializeOwned;
use serde::Serialize;

const ACCOUNTS: &str = "accounts/";
const API_KEYS: &str = "api-keys/";
const ACCOUNT_KEYS: &str = "account-keys/";
const AUDIT: &str = "audit/";
const AUDIT_BY_ACCOUNT: &str = "audit-by-account/";

/// Audit entries read and removed at once by [`Store::trim_audit`].
const TRIM_PAGE: u64 = 1000;

/// The cursor a value under the audit log holds, with the entry's account when it is a whole
/// entry (an account's pointer holds the cursor alone).
fn cursor_in(value: &[u8]) -> Result<(String, Option<String>), StoreError> {
    if value.first() == Some(&b'{') {
        let entry: Entry = serde_json::from_slice(value)?;
        return Ok((entry.cursor, entry.account));
    }
    Ok((String::from_utf8_lossy(value).into_owned(), None))
}

impl Store {
    /// Saves a new account; `false` if one with its id exists.
    pub async fn put_account(&self, account: &Account) -> Result<bool, StoreError> {
        let key = format!("{ACCOUNTS}{}", account.id);
        let value = serde_json::to_vec(account)?;
        self.kv.swap(&key, None, value, None).await
    }

    pub async fn account(&self, id: &str) -> Result<Option<Account>, StoreError> {
        self.get_json(&format!("{ACCOUNTS}{id}")).await
    }

    pub async fn accounts(&self) -> Result<Vec<Account>, StoreError> {
        self.list_json(ACCOUNTS).await
    }

    /// Changes account `id` with `change` as one compare-and-swap (see [`Store::update`]).
    pub async fn update_account<T, E: From<StoreError>>(
        &self,
        id: &str,
        change: impl FnMut(&mut Account) -> Result<T, E>,
    ) -> Result<Option<(Account, T)>, E> {
        self.update_json(&format!("{ACCOUNTS}{id}"), change).await
    }

    /// Saves a new key and lists it under its account.
    pub async fn put_key(&self, key: &ApiKey) -> Result<(), StoreError> {
        let value = serde_json::to_vec(key)?;
        let listed = format!("{ACCOUNT_KEYS}{}/{}", key.account, key.id);
        let entries = vec![
            (format!("{API_KEYS}{}", key.id), value),
            (listed, key.id.clone().into_bytes()),
        ];
        self.kv.put_absent(entries).await?;
        Ok(())
    }

    pub async fn key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        self.get_json(&format!("{API_KEYS}{id}")).await
    }

    /// Account `account`'s keys, revoked ones too, oldest id first.
    pub async fn keys_of(&self, account: &str) -> Result<Vec<ApiKey>, StoreError> {
        let prefix = format!("{ACCOUNT_KEYS}{account}/");
        let ids = self.kv.range(&prefix, &end_of(&prefix)).await?.values;
        let mut keys = Vec::with_capacity(ids.len());
        for id in ids {
            keys.extend(self.key(&String::from_utf8_lossy(&id)).await?);
        }
        Ok(keys)
    }

    /// Lets revoked key `key` go: its record and its place in its account's list (a revoked
    /// key is refused whether it is kept or not; the list stops showing it).
    pub async fn drop_revoked_key(&self, key: &ApiKey) -> Result<(), StoreError> {
        let listed = format!("{ACCOUNT_KEYS}{}/{}", key.account, key.id);
        for single in [format!("{API_KEYS}{}", key.id), listed] {
            let end = format!("{single}\0");
            self.kv
                .replace_range(&single, &end, Vec::new(), None)
                .await?;
        }
        Ok(())
    }

    /// Changes key `id` with `change` as one compare-and-swap.
    pub async fn update_key<T, E: From<StoreError>>(
        &self,
        id: &str,
        change: impl FnMut(&mut ApiKey) -> Result<T, E>,
    ) -> Result<Option<(ApiKey, T)>, E> {
        self.update_json(&format!("{API_KEYS}{id}"), change).await
    }

    /// Keeps `entry` once, under its cursor; an entry of an account is also indexed under
    /// the account by its cursor alone (a pointer, not a second copy).
    /// Keeps `entry`; a store that cannot take it now is logged, and the change it records
    /// stands (it is made already).
    pub async fn record_audit(&self, entry: Entry) {
        if let Err(error) = self.append_audit(&entry).await {
            tracing::error!(%error, action = %entry.action, "an audit entry could not be kept");
        }
    }

    pub async fn append_audit(&self, entry: &Entry) -> Result<(), StoreError> {
        let value = serde_json::to_vec(entry)?;
        let mut entries = vec![(format!("{AUDIT}{}", entry.cursor), value)];
        if let Some(account) = &entry.account {
            let key = format!("{AUDIT_BY_ACCOUNT}{account}/{}", entry.cursor);
            entries.push((key, entry.cursor.as_bytes().to_vec()));
        }
        self.kv.put_absent(entries).await?;
        Ok(())
    }

    /// Removes the audit entries made before `before_ms` (each account's pointers too, for
    /// `accounts`); what the retention (`audit_keep_days`) lets go.
    pub async fn prune_audit(&self, before_ms: u64, accounts: &[String]) -> Result<(), StoreError> {
        let cutoff = format!("{before_ms:020}");
        let mut prefixes = vec![AUDIT.to_string()];
        prefixes.extend(accounts.iter().map(|id| format!("{AUDIT_BY_ACCOUNT}{id}/")));
        for prefix in prefixes {
            let end = format!("{prefix}{cutoff}");
            self.kv
                .replace_range(&prefix, &end, Vec::new(), None)
                .await?;
        }
        Ok(())
    }

    /// Removes the oldest audit entries past the newest `keep`: of the whole log, or of
    /// `account` (its pointers and the entries they point to), a page at a time; how many
    /// went. What the retention's counts (`audit_keep_entries`, an account's
    /// `max_audit_entries`) let go.
    pub async fn trim_audit(&self, account: Option<&str>, keep: u64) -> Result<u64, StoreError> {
        let prefix = match account {
            Some(account) => format!("{AUDIT_BY_ACCOUNT}{account}/"),
            None => AUDIT.to_string(),
        };
        let end = end_of(&prefix);
        let mut over = self.kv.count(&prefix, &end).await?.saturating_sub(keep);
        let mut removed = 0;
        while over > 0 {
            let page = self
                .kv
                .range_first(&prefix, &end, over.min(TRIM_PAGE) as usize)
                .await?;
            let found: Vec<(String, Option<String>)> = page
                .iter()
                .map(|value| cursor_in(value))
                .collect::<Result<_, _>>()?;
            let Some((last, _)) = found.last() else {
                break;
            };
            // The other side of each: an account's trim takes the entries themselves (so one
            // account's flood of changes leaves the others' entries in the whole log), the
            // whole log's takes their accounts' pointers (left, they would make an account's
            // pages come up short).
            for (cursor, of_account) in &found {
                let single = match (account, of_account) {
                    (Some(_), _) => format!("{AUDIT}{cursor}"),
                    (None, Some(of_account)) => format!("{AUDIT_BY_ACCOUNT}{of_account}/{cursor}"),
                    (None, None) => continue,
                };
                let end = format!("{single}\0");
                self.kv
                    .replace_range(&single, &end, Vec::new(), None)
                    .await?;
            }
            let through = format!("{prefix}{last}\0");
            self.kv
                .replace_range(&prefix, &through, Vec::new(), None)
                .await?;
            removed += found.len() as u64;
            over = over.saturating_sub(found.len() as u64);
        }
        Ok(removed)
    }

    /// At most `limit` audit entries (of `account` only, if given) whose cursors are after
    /// `after` and before `before`, oldest first.
    pub async fn audit(
        &self,
        account: Option<&str>,
        after: &str,
        before: &str,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let prefix = match account {
            Some(account) => format!("{AUDIT_BY_ACCOUNT}{account}/"),
            None => AUDIT.to_string(),
        };
        // Just past `after`: the entry at the cursor itself was on the page before.
        let start = format!("{prefix}{after}\0");
        let end = format!("{prefix}{before}");
        let values = self.kv.range_first(&start, &end, limit).await?;
        let mut entries = Vec::with_capacity(values.len());
        for value in values {
            // An account's index holds cursors (stores from before it held whole entries).
            if value.first() == Some(&b'{') {
                entries.push(serde_json::from_slice(&value)?);
                continue;
            }
            let cursor = String::from_utf8_lossy(&value);
            // Gone when the retention let it go between the two reads.
            if let Some(entry) = self.get_json(&format!("{AUDIT}{cursor}")).await? {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    pub(super) async fn get_json<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.kv.get(key).await? {
            Some(stored) => Ok(Some(serde_json::from_slice(&stored.value)?)),
            None => Ok(None),
        }
    }

    pub(super) async fn list_json<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<T>, StoreError> {
        let listed = self.kv.range(prefix, &end_of(prefix)).await?;
        listed
            .values
            .iter()
            .map(|value| Ok(serde_json::from_slice(value)?))
            .collect()
    }

    /// `change` applied to the record at `key` as one compare-and-swap, tried again while
    /// another change wins the race (so `change` may run more than once, and may refuse with
    /// `Err`, which changes nothing); `None` if there is no record.
    async fn update_json<R, T, E>(
        &self,
        key: &str,
        change: impl FnMut(&mut R) -> Result<T, E>,
    ) -> Result<Option<(R, T)>, E>
    where
        R: Serialize + DeserializeOwned,
        E: From<StoreError>,
    {
        let updated = self.swap_json(key, change).await?;
        Ok(updated.map(|(record, answer, _)| (record, answer)))
    }

    /// [`Store::update_json`], fenced when this handle is, saying whether it wrote (a change
    /// that changes nothing writes nothing).
    pub(super) async fn swap_json<R, T, E>(
        &self,
        key: &str,
        mut change: impl FnMut(&mut R) -> Result<T, E>,
    ) -> Result<Option<(R, T, bool)>, E>
    where
        R: Serialize + DeserializeOwned,
        E: From<StoreError>,
    {
        loop {
            let Some(old) = self.kv.get(key).await? else {
                return Ok(None);
            };
            let mut record: R = serde_json::from_slice(&old.value).map_err(StoreError::from)?;
            let answer = change(&mut record)?;
            let new = serde_json::to_vec(&record).map_err(StoreError::from)?;
            if new == old.value {
                return Ok(Some((record, answer, false)));
            }
            let fence = self.fence.as_ref();
            if self.kv.swap(key, Some(&old.version), new, fence).await? {
                return Ok(Some((record, answer, true)));
            }
        }
    }
}
