//! The store's two backends side by side, through the control plane's own `Store`: sled in a
//! temporary directory and a real etcd (one member, on loopback). Whatever the backend, the
//! same calls give the same answers: compare-and-swap under races, records kept once, reads
//! of more records than one etcd response holds, and writes fenced by a leadership.

use controlplane::model::queue::{self, NewQueue, Queue, Tier};
use controlplane::store::{Fence, Report, Store, StoreConfig, StoreError};
use qe_tests::etcd::EtcdCluster;

/// A sled store and an etcd store (the etcd and the directory live as long as they do).
async fn both() -> (Vec<(&'static str, Store)>, EtcdCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sled = Store::open(&StoreConfig::Sled, dir.path(), "test")
        .await
        .unwrap();
    let etcd = EtcdCluster::single();
    let config: StoreConfig = toml::from_str(&format!(
        "kind = \"etcd\"\nendpoints = [{:?}]\n",
        etcd.endpoint(0)
    ))
    .unwrap();
    let shared = Store::open(&config, dir.path(), "test").await.unwrap();
    (vec![("sled", sled), ("etcd", shared)], etcd, dir)
}

fn a_queue() -> Queue {
    let new = NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: false,
        account: None,
        ..Default::default()
    };
    queue::create(new).0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_to_one_record_all_land() {
    let (stores, _etcd, _dir) = both().await;
    for (backend, store) in stores {
        let queue = a_queue();
        assert!(store.put(&queue).await.unwrap());
        assert!(!store.put(&queue).await.unwrap(), "{backend}: created once");
        let start = queue.config_version;
        let changes = (0..20).map(|_| {
            let store = store.clone();
            let id = queue.id.clone();
            tokio::spawn(async move {
                let bumped = store.update(&id, |queue| {
                    queue.config_version += 1;
                    Ok::<_, StoreError>(queue.config_version)
                });
                bumped.await.unwrap().unwrap().1
            })
        });
        let mut seen: Vec<u64> = futures::future::join_all(changes)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        seen.sort();
        let expected: Vec<u64> = (start + 1..=start + 20).collect();
        assert_eq!(seen, expected, "{backend}: each change saw the one before");
        let now = store.get(&queue.id).await.unwrap().unwrap();
        assert_eq!(now.config_version, start + 20, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_kept_once_and_read_back_whole_past_one_response() {
    let (stores, _etcd, _dir) = both().await;
    for (backend, store) in stores {
        // More records than etcd takes in one transaction, and more bytes (4.8 MB) than
        // one gRPC response may hold (4 MiB).
        let padding = "x".repeat(4_000);
        let records: Vec<(u64, Vec<u8>)> = (0..1_200u64)
            .map(|time| {
                (
                    time,
                    format!("{{\"time\":{time},\"pad\":\"{padding}\"}}").into_bytes(),
                )
            })
            .collect();
        let (usage, stats) = store
            .keep_reports("q1", records.clone(), vec![(7, b"{}".to_vec())])
            .await
            .unwrap();
        assert_eq!((usage.new, usage.already_kept), (1_200, 0), "{backend}");
        assert_eq!((stats.new, stats.already_kept), (1, 0), "{backend}");
        let kept = store.reports_of("q1", Report::Usage).await.unwrap();
        let sent: Vec<Vec<u8>> = records.iter().map(|(_, record)| record.clone()).collect();
        assert_eq!(kept, sent, "{backend}: every record, oldest first");
        let day = store
            .reports_in("q1", Report::Usage, 100..200)
            .await
            .unwrap();
        assert_eq!(day.len(), 100, "{backend}: a range of times");

        // Sent again (a lost reply), and with one time twice in one report: kept once, the
        // first as sent.
        let again = vec![records[5].clone(), (5, b"{\"other\":1}".to_vec())];
        let (usage, _) = store.keep_reports("q1", again, vec![]).await.unwrap();
        assert_eq!((usage.new, usage.already_kept), (0, 2), "{backend}");
        let kept = store.reports_in("q1", Report::Usage, 5..6).await.unwrap();
        assert_eq!(kept, [records[5].1.clone()], "{backend}");
        let dumped = store.dump().await.unwrap();
        assert_eq!(
            dumped.len(),
            1_201,
            "{backend}: the whole store in a backup"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fenced_by_a_leadership_that_ended_is_refused_on_etcd() {
    let (stores, _etcd, _dir) = both().await;
    let (_, shared) = &stores[1];
    let queue = a_queue();
    shared.put(&queue).await.unwrap();
    // A leader key that no longer exists (its lease ran out): the revision it was made at
    // names a leadership that is over.
    let gone = Fence {
        key: "/qe/test/leader".into(),
        revision: 1,
    };
    let fenced_store = shared.fenced(gone);
    let fenced = fenced_store.update(&queue.id, |queue| {
        queue.config_version += 1;
        Ok::<_, StoreError>(())
    });
    assert!(
        matches!(fenced.await, Err(StoreError::NotLeader)),
        "a write of a leadership that is over"
    );
    let now = shared.get(&queue.id).await.unwrap().unwrap();
    assert_eq!(now.config_version, queue.config_version, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zone_serial_on_etcd_never_goes_back_for_a_new_store_or_a_restore() {
    let etcd = EtcdCluster::single();
    let dir = tempfile::tempdir().unwrap();
    let on = |prefix: &str| {
        toml::from_str::<StoreConfig>(&format!(
            "kind = \"etcd\"\nendpoints = [{:?}]\nprefix = {prefix:?}\n",
            etcd.endpoint(0)
        ))
        .unwrap()
    };
    let store = Store::open(&on("/qe/one/"), dir.path(), "test")
        .await
        .unwrap();
    // A new store's first serial is not its first revision: it is above any serial a one-host
    // install (seconds since 1970) served before it.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let first = store.zone_inputs().await.unwrap().serial.unwrap();
    assert!(first >= now - 60, "{first} from {now}");
    store.put(&a_queue()).await.unwrap();
    let second = store.zone_inputs().await.unwrap().serial.unwrap();
    assert!(second > first, "{first} → {second}");
    // Restored into another store, whose revisions start again: on past the backup's serial.
    let backup = store.dump().await.unwrap();
    let other = Store::open(&on("/qe/two/"), dir.path(), "test")
        .await
        .unwrap();
    other.restore(backup, now, second + 1_000).await.unwrap();
    let restored = other.zone_inputs().await.unwrap().serial.unwrap();
    assert!(restored > second + 1_000, "{second} → {restored}");
    assert!(other.restored().await.unwrap().is_some());
}

/// Records as kept: (time, JSON).
type Records = Vec<(u64, Vec<u8>)>;

/// Three days of a node's records as it reports them (usage, stats): stats every 5 minutes,
/// usage every half hour, from `start`.
fn three_days_of_records(start: u64) -> (Records, Records) {
    use qe_shared::node_channel::{StatsRecord, UsageRecord};
    let stats = (0..3 * 288u64).map(|i| {
        let time = start + i * 300;
        let record = StatsRecord {
            time,
            messages: i,
            publishers: 1,
            subscribers: 1,
            saved_subscribers: 0,
            administrators: 0,
            unacknowledged: 0,
            dead_letter: 0,
            delayed: 0,
            durable: i,
            published: Some(2),
            delivered: Some(1),
        };
        (time, serde_json::to_vec(&record).unwrap())
    });
    let usage = (1..=3 * 48u64).map(|i| {
        let time = start + i * 1800;
        let record = UsageRecord {
            time,
            network_sent: 1000 + i,
            network_received: 10,
            storage_written: 5,
            storage_read: 6,
            storage_held: 1_000_000 + i * 1000,
            instance_type: "local".into(),
            region: "local".into(),
            // IPv4 for three hours of the second day.
            ipv4: (60..66).contains(&i),
        };
        (time, serde_json::to_vec(&record).unwrap())
    });
    (usage.collect(), stats.collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aged_records_are_rolled_up_and_bill_the_same() {
    use controlplane::rollup;
    use qe_shared::node_channel::{StatsRecord, UsageRecord};
    let (stores, _etcd, _dir) = both().await;
    let october = controlplane::usage::parse_month("2026-10").unwrap();
    let now = controlplane::usage::parse_date("2026-12-03").unwrap();
    for (backend, store) in stores {
        let queue = a_queue();
        assert!(store.put(&queue).await.unwrap());
        let (usage, stats) = three_days_of_records(october.0);
        store.keep_reports(&queue.id, usage, stats).await.unwrap();
        let read_usage = || async {
            let stored = store.reports_of(&queue.id, Report::Usage).await.unwrap();
            let records: Vec<UsageRecord> = stored
                .iter()
                .map(|r| serde_json::from_slice(r).unwrap())
                .collect();
            records
        };
        let bill = |records: &[UsageRecord]| {
            let prices = controlplane::config::Prices::default();
            let created = october.0 - 600;
            controlplane::usage::bill(&queue.id, created, records, october.0, october.1, &prices)
        };
        let before = bill(&read_usage().await);
        // A pass over all time, as the leader's passes do a week at a time.
        let rolled = rollup::pass_queue(&store, &queue.id, now, u64::MAX)
            .await
            .unwrap();
        assert_eq!(
            rolled.read,
            3 * 288 + 3 * 24 + 3 * 48,
            "{backend}: {rolled:?}"
        );
        // October's stats are a day each now (over 31 days old), its usage a day and
        // IPv4-or-not each (its bill is closed).
        let stats = store.reports_of(&queue.id, Report::Stats).await.unwrap();
        let stats: Vec<StatsRecord> = stats
            .iter()
            .map(|r| serde_json::from_slice(r).unwrap())
            .collect();
        assert_eq!(stats.len(), 3, "{backend}: {stats:?}");
        assert_eq!(stats[0].messages, 287, "{backend}: the day's last counters");
        assert_eq!(stats[0].published, Some(2 * 288), "{backend}: summed");
        let usage = read_usage().await;
        // Three days and the midnight of the fourth; the second day in three runs.
        assert_eq!(
            usage.len(),
            6,
            "{backend}: a record per day and placement: {usage:?}"
        );
        let after = bill(&usage);
        assert_eq!(before.len(), after.len(), "{backend}");
        for (a, b) in before.iter().zip(&after) {
            assert_eq!(a.item, b.item, "{backend}");
            assert!((a.amount - b.amount).abs() < 1e-6, "{backend}: {a:?} {b:?}");
            assert!(
                (a.quantity - b.quantity).abs() < 1e-6,
                "{backend}: {a:?} {b:?}"
            );
        }
        // Again: nothing more to do.
        let again = rollup::pass_queue(&store, &queue.id, now, u64::MAX)
            .await
            .unwrap();
        assert_eq!(
            (again.read, again.kept),
            (3 + 3 + 6, 3 + 3 + 6),
            "{backend}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_upkeep_compacts_etcds_history_and_defragments_its_members() {
    let (stores, _etcd, _dir) = both().await;
    for (backend, store) in stores {
        let kv = store.backend();
        // 4 MiB written and deleted (in requests under etcd's 1.5 MiB): history, then free
        // pages once compacted.
        let big = vec![7u8; 16 * 1024];
        for round in 0..8 {
            let entries = (0..32)
                .map(|i| (format!("garbage/{round}/{i:03}"), big.clone()))
                .collect();
            kv.put_absent(entries).await.unwrap();
            kv.replace_range("garbage/", "garbage0", Vec::new(), None)
                .await
                .unwrap();
        }
        let first = kv.upkeep(None, i64::MAX).await.unwrap();
        let Some(first) = first else {
            assert_eq!(backend, "sled", "only sled has no upkeep");
            continue;
        };
        assert_eq!((first.compacted_to, first.defragmented), (None, 0));
        let second = kv.upkeep(Some(first.revision), i64::MAX).await.unwrap();
        let second = second.unwrap();
        assert_eq!(second.compacted_to, Some(first.revision), "{second:?}");
        // The space compaction frees shows once etcd's backend commits a write after it (a
        // store that serves queues writes all the time; the next hourly look defragments).
        kv.put_absent(vec![("after".into(), b"a write".to_vec())])
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let second = loop {
            let done = kv.upkeep(None, 1 << 20).await.unwrap().unwrap();
            if done.defragmented > 0 || std::time::Instant::now() > deadline {
                break done;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        assert_eq!(second.defragmented, 1, "{second:?}");
        assert!(second.freed > 2 << 20, "{second:?}");
        // Defragmented, it has nothing more to give back.
        let third = kv.upkeep(Some(second.revision), 1 << 20).await.unwrap();
        assert_eq!(third.unwrap().defragmented, 0);
    }
}

/// etcd over TLS with client certificates (`[store] ca_file`, `cert_file`, `key_file`): the
/// store works through it, and an etcd that asks for a client certificate refuses a store
/// without one (its first read fails: nothing is served from a store it cannot reach).
#[tokio::test]
async fn etcd_over_tls_with_a_client_certificate_and_not_without() {
    let etcd = qe_tests::etcd::TlsEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let with: StoreConfig = toml::from_str(&strip_table(&etcd.store_config(true))).unwrap();
    let store = Store::open(&with, dir.path(), "tls").await.unwrap();
    let (queue, _) = queue::create(NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ..Default::default()
    });
    assert!(store.put(&queue).await.unwrap(), "written over TLS");
    let read = store
        .get(&queue.id)
        .await
        .unwrap()
        .expect("read back over TLS");
    assert_eq!(read.id, queue.id);

    let without: StoreConfig = toml::from_str(&strip_table(&etcd.store_config(false))).unwrap();
    let refused = match Store::open(&without, dir.path(), "tls").await {
        Ok(store) => store.get(&queue.id).await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(refused.is_err(), "no client certificate, no store");
}

/// A `[store]` table's body, as `StoreConfig` reads it on its own.
fn strip_table(config: &str) -> String {
    config.trim_start_matches("[store]\n").to_string()
}

/// etcd's users (`[store] user`, `password_file`): with `auth enable`, the store works as its
/// user, and is refused without it or with a wrong password.
#[tokio::test]
async fn etcd_with_users_takes_the_stores_user_and_refuses_others() {
    let etcd = EtcdCluster::single();
    let endpoint = etcd.endpoint(0);
    let etcdctl = |args: &[&str]| {
        let output = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoint])
            .args(args)
            .output()
            .expect("etcdctl runs (scripts/test installs etcd-client)");
        assert!(output.status.success(), "etcdctl {args:?}: {output:?}");
    };
    etcdctl(&["user", "add", "root:root-password"]);
    etcdctl(&["user", "add", "qe:qe-password"]);
    etcdctl(&["role", "add", "qe-role"]);
    etcdctl(&[
        "role",
        "grant-permission",
        "qe-role",
        "--prefix=true",
        "readwrite",
        "/qe/",
    ]);
    etcdctl(&["user", "grant-role", "qe", "qe-role"]);
    etcdctl(&["auth", "enable"]);

    let dir = tempfile::tempdir().unwrap();
    let store_as = |password: &str| {
        let file = dir.path().join(format!("password-{password}"));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let text = format!(
            "kind = \"etcd\"\nendpoints = [{endpoint:?}]\nuser = \"qe\"\npassword_file = {file:?}\n"
        );
        toml::from_str::<StoreConfig>(&text).unwrap()
    };
    let (queue, _) = queue::create(NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ..Default::default()
    });
    let store = Store::open(&store_as("qe-password"), dir.path(), "users")
        .await
        .unwrap();
    assert!(store.put(&queue).await.unwrap(), "written as its user");
    let wrong = match Store::open(&store_as("wrong"), dir.path(), "users").await {
        Ok(store) => store.get(&queue.id).await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(wrong.is_err(), "a wrong password is refused");
    let plain: StoreConfig =
        toml::from_str(&format!("kind = \"etcd\"\nendpoints = [{endpoint:?}]\n")).unwrap();
    let anonymous = match Store::open(&plain, dir.path(), "users").await {
        Ok(store) => store.get(&queue.id).await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(anonymous.is_err(), "no user, no store");
}
