//! `bench failover --instances`: issue 35's failover over machines of their own. One control
//! plane with the EC2 provider against moto (as `tests/instance.rs` starts it,
//! `qe_tests::cloud`) and one queue made with `replicas: 2`: its node's machine and its
//! standby's each a network namespace booted from the user data EC2 was given. Publishers at
//! durability 2 and subscribers that hold what they receive reach the queue by its name all
//! along (the control plane's DNS, wss:// with the local CA's root). Each round, at a random
//! moment, the serving machine is killed, processes and network; once its node has been
//! silent for the silence limit, the control plane fences it and promotes the standby's
//! machine, the name moving there, and places the next standby, which the bench boots beside
//! it. Measured per round from the kill: until a publisher on a new connection is answered
//! again (the queue serves again by name), and until durability 2 is Success again (the next
//! standby caught up). At the end every publish answered Success at durability 2 must have
//! been delivered, and none to a second subscriber while another held it; exits 1 otherwise.
//! docs/resilience.md, *Failover onto the standby's machine*.

use crate::failover::Settings;
use crate::failover_load::{self, Connection, Load, Way};
use futures::{SinkExt, StreamExt};
use qe_ec2::Ec2;
use qe_tests::cloud::{self, Api};
use qe_tests::instance::{HostAddress, Instance};
use qe_tests::Client;
use serde_json::Value;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Which of the host's own addresses the instances reach the control plane at
/// (`cloud::control_plane_v6`): the tests take 1 and 2, so a run beside them keeps its own.
const CONTROL_PLANE_ADDRESS: u16 = 9;

/// The longest a round may take to recover before the run gives up: it includes the boot of
/// the next standby's machine, whose first boot downloads a debug `dataplane`.
const RECOVER_WITHIN: Duration = Duration::from_secs(120);

/// The names of the queue's first two machines' namespaces (node, standby); each round boots
/// one more, `fbN`.
const FIRST_TWO: [&str; 2] = ["fb1", "fb2"];

/// How long opening a connection may take: resolving, TCP, TLS and the upgrade take tens of
/// milliseconds here, while a connection to a killed machine's address, which the name keeps
/// until the promotion, fails only after a second ("no route to host").
const OPEN_WITHIN: Duration = Duration::from_millis(500);

/// Silence on a connection after which a client pings the node, and after as long again
/// without a frame takes the connection for lost: a killed machine's connections end with
/// neither FIN nor RST.
const QUIET: Duration = Duration::from_secs(1);

/// The queue by its name: resolved through the control plane's DNS, over wss:// with the
/// certificate checked for the name against the local CA's root.
#[derive(Clone)]
struct ByName {
    dns: SocketAddr,
    host: String,
    root: String,
}

impl Way for ByName {
    type Connection = Client;
    // Each attempt resolves the name with `dig`, a process of its own.
    const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

    async fn open(&self) -> Option<Client> {
        let connecting = cloud::try_connect(self.dns, &self.host, &self.root);
        tokio::time::timeout(OPEN_WITHIN, connecting)
            .await
            .ok()
            .flatten()
    }
}

impl Connection for Client {
    async fn send_text(&mut self, text: String) -> bool {
        let sending = self.socket().send(Message::text(text));
        matches!(tokio::time::timeout(QUIET, sending).await, Ok(Ok(())))
    }

    async fn next_text(&mut self) -> Option<String> {
        let mut pinged = false;
        loop {
            match tokio::time::timeout(QUIET, self.socket().next()).await {
                Ok(Some(Ok(Message::Text(text)))) => return Some(text.to_string()),
                Ok(Some(Ok(_))) => pinged = false,
                Ok(Some(Err(_)) | None) => return None,
                Err(_) if pinged => return None,
                Err(_) => {
                    let ping = self.socket().send(Message::Ping(Default::default()));
                    if !matches!(tokio::time::timeout(QUIET, ping).await, Ok(Ok(()))) {
                        return None;
                    }
                    pinged = true;
                }
            }
        }
    }
}

/// A booted machine of the queue: its namespace's name and EC2's id for it.
struct Machine {
    name: String,
    ec2_id: String,
    /// Killed when dropped: everything in its namespace SIGKILLed, the namespace removed.
    _instance: Instance,
}

/// The queue's two machines: the one that serves, and the one that follows it.
struct Machines {
    serving: Machine,
    standby: Machine,
}

/// The run, on a runtime of several threads: every client resolves the name with `dig`, a
/// process it waits for, and must not hold up the others' timing meanwhile.
pub fn failover(settings: &Settings, data_root: &Path) -> bool {
    run_beside_the_debug_binaries();
    let dir = data_root.join("failover-instances");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the run's directory");
    std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(run(settings, &dir))
        });
        run.join().expect("the run ends")
    })
}

/// qe_tests starts the `controlplane` that `cargo build --workspace --bins` built, which
/// serves instances that build's `dataplane`: it finds them two folders above the running
/// program, where a test in target/debug/deps has them. From target/release/bench that is
/// target/, which has none; so the bench goes on as a hard link of itself in
/// target/debug/failover-instances/. Returns when it runs from such a place already.
fn run_beside_the_debug_binaries() {
    let exe = std::env::current_exe().expect("the running program's path");
    let target = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/PROFILE/");
    if target.join("controlplane").exists() {
        return;
    }
    let beside = target.join("debug/failover-instances/bench");
    std::fs::create_dir_all(beside.parent().expect("a folder")).expect("its folder");
    let _ = std::fs::remove_file(&beside);
    if std::fs::hard_link(&exe, &beside).is_err() {
        std::fs::copy(&exe, &beside).expect("a copy of the bench");
    }
    println!(
        "going on as {}, beside the debug binaries",
        beside.display()
    );
    let error = std::process::Command::new(&beside)
        .args(std::env::args_os().skip(1))
        .exec();
    panic!("{}: {error}", beside.display());
}

async fn run(settings: &Settings, dir: &Path) -> bool {
    let at = cloud::control_plane_v6(CONTROL_PLANE_ADDRESS);
    let _address = HostAddress::keep(at);
    let (moto, ec2, files, api) = cloud::cloud_reached_at(at).await;
    let two = cloud::two_machines(&api, &ec2, files.path(), FIRST_TWO).await;
    drop(two.publisher);
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem"));
    let by_name = ByName {
        dns: api.cp.dns.expect("a DNS server"),
        host: two.host.clone(),
        root: root.expect("the local CA's root"),
    };
    let silence_limit = cloud::silence_limit();
    let limit = silence_limit.as_secs();
    println!("queue {} on two machines; silence limit {limit} s", two.id);
    let hold = Duration::from_millis(settings.hold_ms);
    let (publishers, subscribers) = (settings.publishers, settings.subscribers);
    let load = Load::start(&by_name, &two.logins, publishers, subscribers, hold);
    let mut machines = Machines::first(&two.queue, two.node, two.standby);
    let mut rounds = failover_load::Rounds::default();
    for round in 1..=settings.rounds {
        // A random moment in the next 1 to 3 s of the load.
        let wait = 1000 + u32::from_le_bytes(qe_shared::random::bytes()) % 2000;
        tokio::time::sleep(Duration::from_millis(wait.into())).await;
        let lost = failover_load::lost_now(&load.seen);
        let Machines { serving, standby } = machines;
        kill(round, serving).await;
        let name = format!("fb{}", round + FIRST_TWO.len());
        machines = promoted_and_followed(&api, &ec2, &two.id, files.path(), standby, name).await;
        let seen = &load.seen;
        rounds.recovered(round, seen, lost, RECOVER_WITHIN).await;
    }
    let seen = load.stop().await;
    // What the subscribers held when they stopped comes once their sessions' time runs out,
    // behind the marker: the drain waits for it.
    let drained = failover_load::drain(&by_name, &two.logins).await;
    tokio::task::spawn_blocking(move || drop(machines))
        .await
        .expect("the machines killed");
    keep_logs(&api, files.path(), dir);
    drop((api, moto, files));
    let passed = failover_load::report(&rounds, &seen, &drained);
    report_against_the_silence_limit(&rounds.serving, silence_limit);
    passed
}

impl Machines {
    /// The two machines [`cloud::two_machines`] booted as [`FIRST_TWO`] for `queue`.
    fn first(queue: &Value, node: Instance, standby: Instance) -> Machines {
        let ec2_id = |slot: &str| {
            queue["resources"][slot]
                .as_str()
                .expect("placed")
                .to_string()
        };
        Machines {
            serving: machine(FIRST_TWO[0], ec2_id("instance"), node),
            standby: machine(FIRST_TWO[1], ec2_id("standby_instance"), standby),
        }
    }
}

fn machine(name: &str, ec2_id: String, instance: Instance) -> Machine {
    Machine {
        name: name.to_string(),
        ec2_id,
        _instance: instance,
    }
}

/// Kills `machine`, processes and network, and says when: the logs' times are UTC, and what a
/// round's time was made of is read there from this moment. (`boot.py --cleanup` SIGKILLs the
/// machine's processes once it has started, then removes its namespace: the machine runs for
/// a moment after this one.)
async fn kill(round: usize, machine: Machine) {
    let unix = std::time::UNIX_EPOCH.elapsed().expect("after 1970");
    let started = std::time::Instant::now();
    let name = machine.name.clone();
    tokio::task::spawn_blocking(move || drop(machine))
        .await
        .expect("the machine killed");
    println!(
        "round {round:2}: {name} killed at unix time {:.3} s (its namespace gone {:.0} ms later)",
        unix.as_secs_f64(),
        failover_load::ms(started.elapsed())
    );
}

/// Once the control plane has promoted `standby`'s machine (its node silent) and placed the
/// next standby, boots that one as `name` beside it and waits until it has caught up. The
/// machines from then on.
async fn promoted_and_followed(
    api: &Api,
    ec2: &Ec2,
    id: &str,
    files: &Path,
    standby: Machine,
    name: String,
) -> Machines {
    let promoted = standby.ec2_id.as_str();
    api.until(id, |queue| queue["resources"]["instance"] == promoted)
        .await;
    let queue = api
        .until(id, |queue| {
            let next = queue["resources"]["standby_instance"].as_str();
            next.is_some_and(|next| next != promoted)
        })
        .await;
    let instance = cloud::boot_standby(ec2, &queue, &name, &standby.name, files).await;
    let instance = tokio::task::spawn_blocking(move || {
        instance.wait_for_node_log("caught up with the primary");
        instance
    })
    .await
    .expect("caught up");
    let ec2_id = standby_of(&queue);
    Machines {
        serving: standby,
        standby: machine(&name, ec2_id, instance),
    }
}

fn standby_of(queue: &Value) -> String {
    let instance = queue["resources"]["standby_instance"].as_str();
    instance.expect("a standby placed").to_string()
}

/// The control plane's log and every machine's node log, into `dir`: what a round's time
/// was made of is read there.
fn keep_logs(api: &Api, files: &Path, dir: &Path) {
    std::fs::write(dir.join("controlplane.log"), api.cp.log_text()).expect("the log kept");
    let machines = std::fs::read_dir(files).expect("the machines' files");
    for machine in machines.filter_map(Result::ok) {
        let log = machine.path().join("node.log");
        let name = machine.file_name().to_string_lossy().to_string();
        if log.exists() {
            let kept = dir.join(format!("{name}-node.log"));
            std::fs::copy(&log, kept).expect("a node's log kept");
        }
    }
}

/// Serving again against the bound: by name within 10 s of the silence limit, the
/// time measured from the kill.
fn report_against_the_silence_limit(serving: &[Duration], silence_limit: Duration) {
    let Some((median, worst)) = failover_load::median_and_worst(serving) else {
        return;
    };
    let beyond = |time: Duration| failover_load::ms(time.saturating_sub(silence_limit));
    let bound = silence_limit + Duration::from_secs(10);
    println!(
        "silence limit: {} s; serving again beyond it: median {:.0} ms, worst {:.0} ms; \
         served again within 10 s of it ({} s from the kill) in every round: {}",
        silence_limit.as_secs(),
        beyond(median),
        beyond(worst),
        bound.as_secs(),
        if worst <= bound { "yes" } else { "no" }
    );
}
