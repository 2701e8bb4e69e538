//! What the clients saw, cut into the run's windows (one per fault, from its start to the end
//! of the settle after it, plus the quiet start and the drain), printed as one table, and
//! checked against the targets.
//!
//! Attribution: a cut, an unanswered publish and an API call count in the window they
//! happened in (an API call by when it was sent); a gap between two acknowledged publishes
//! counts in every window it overlaps, with the part of it inside the window;
//! an acknowledged message never delivered counts in the window its publish was acknowledged
//! in (where the loss was caused may be later); a message delivered twice, in the window of
//! its second delivery.

use super::clients::{lock, Answer, Board};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// An API call slower than this is named under the table.
const SLOW_CALL: Duration = Duration::from_millis(500);

/// One stretch of the run.
pub struct Window {
    pub name: String,
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    /// What happened in it, for the lines under the table.
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    None,
    LeaderKilled,
    EtcdLeaderKilled,
    /// A node SIGSTOPped: how long from the signal until its queue took a publish again on
    /// a new connection (`None`: not within the run's wait), and the target.
    NodeStopped {
        serving_after: Option<Duration>,
        target: Duration,
    },
    ReplicaRestarted,
    Drain,
}

/// One window's counts.
struct Row {
    cuts: usize,
    /// Per queue, the longest stretch of the window without an acknowledged publish
    /// (`None` while nothing was published: the drain).
    gaps: Vec<Option<Duration>>,
    unanswered: usize,
    refused: usize,
    calls: usize,
    unavailable: usize,
    unreachable: usize,
    /// Answers neither 2xx nor 503, and calls with no answer in time.
    other: usize,
    slowest: Duration,
    lost: usize,
    twice: usize,
}

/// Prints the table, the notes and the targets; whether every target was met.
pub fn report(board: &Board, windows: &[Window]) -> bool {
    let queues = board.queues.len();
    let rows: Vec<Row> = windows.iter().map(|w| row(board, w)).collect();
    println!();
    let gap_heads: String = (0..queues)
        .map(|q| format!(" {:>7}", format!("gap q{q}")))
        .collect();
    println!(
        "{:<36} {:>6} {:>4} {:>5} {:>5}{gap_heads} {:>5} {:>4} {:>6} {:>5} {:>8} {:>5} {:>5}",
        "window",
        "secs",
        "cut",
        "unans",
        "refus",
        "API",
        "503",
        "unrch",
        "other",
        "slowest",
        "lost",
        "twice"
    );
    for (window, row) in windows.iter().zip(&rows) {
        let gaps: String = row
            .gaps
            .iter()
            .map(|gap| match gap {
                Some(gap) => format!(" {:>7.2}", gap.as_secs_f64()),
                None => format!(" {:>7}", "-"),
            })
            .collect();
        println!(
            "{:<36} {:>6.1} {:>4} {:>5} {:>5}{gaps} {:>5} {:>4} {:>6} {:>5} {:>7.2}s {:>5} {:>5}",
            window.name,
            (window.end - window.start).as_secs_f64(),
            row.cuts,
            row.unanswered,
            row.refused,
            row.calls,
            row.unavailable,
            row.unreachable,
            row.other,
            row.slowest.as_secs_f64(),
            row.lost,
            row.twice
        );
    }
    print_totals(board, &rows);
    println!();
    for window in windows {
        for note in &window.notes {
            println!("{}: {note}", window.name);
        }
        if let Some(failed) = failed_calls(board, window) {
            println!("{}: API calls not answered 200: {failed}", window.name);
        }
        if let Some(slowest) = slowest_call(board, window) {
            println!("{}: the slowest API call: {slowest}", window.name);
        }
    }
    targets(windows, &rows)
}

fn row(board: &Board, window: &Window) -> Row {
    let inside = |at: Instant| at >= window.start && at < window.end;
    let mut row = Row {
        cuts: 0,
        gaps: Vec::new(),
        unanswered: 0,
        refused: 0,
        calls: 0,
        unavailable: 0,
        unreachable: 0,
        other: 0,
        slowest: Duration::ZERO,
        lost: 0,
        twice: 0,
    };
    for queue in &board.queues {
        let published = lock(&queue.published);
        let received = lock(&queue.received);
        row.cuts += published.cuts.iter().filter(|cut| inside(cut.at)).count();
        row.cuts += received.cuts.iter().filter(|cut| inside(cut.at)).count();
        row.unanswered += published
            .unanswered
            .iter()
            .filter(|(at, _)| inside(*at))
            .count();
        row.refused += published
            .refused
            .iter()
            .filter(|(at, _)| inside(*at))
            .count();
        row.gaps.push(match window.fault {
            Fault::Drain => None,
            _ => {
                // The publisher's stop ends the last stretch; an ack is never later.
                let mut times: Vec<Instant> = published.acks.iter().map(|ack| ack.at).collect();
                times.extend(published.stopped);
                // Each stretch between two acks, cut to the window.
                times
                    .windows(2)
                    .filter(|pair| pair[0] < window.end && pair[1] > window.start)
                    .map(|pair| pair[1].min(window.end) - pair[0].max(window.start))
                    .max()
            }
        });
        let mut delivered: HashMap<u64, Vec<Instant>> = HashMap::new();
        for (at, seq) in &received.deliveries {
            delivered.entry(*seq).or_default().push(*at);
        }
        row.lost += published
            .acks
            .iter()
            .filter(|ack| inside(ack.at) && !delivered.contains_key(&ack.seq))
            .count();
        row.twice += delivered
            .values()
            .filter(|times| times.len() > 1 && inside(times[1]))
            .count();
    }
    for call in lock(&board.calls).iter().filter(|call| inside(call.at)) {
        row.calls += 1;
        row.slowest = row.slowest.max(call.took);
        match &call.answer {
            Answer::Status(503) => row.unavailable += 1,
            Answer::Status(status) if (200..300).contains(status) => {}
            Answer::Status(_) | Answer::TimedOut => row.other += 1,
            Answer::Unreachable(_) => row.unreachable += 1,
        }
    }
    row
}

/// The window's API calls that were not answered 200, by kind and answer
/// (`writes: 202 x1, 503 x2, unreachable x1; reads: …`), if there were any. A rotation
/// answered 202 was not confirmed by the node within the API's wait.
fn failed_calls(board: &Board, window: &Window) -> Option<String> {
    let mut kinds = Vec::new();
    for (write, kind) in [(true, "writes"), (false, "reads")] {
        let mut answers: std::collections::BTreeMap<String, usize> = Default::default();
        let calls = lock(&board.calls);
        let failed = calls
            .iter()
            .filter(|call| call.write == write && call.at >= window.start && call.at < window.end);
        for call in failed {
            let answer = match &call.answer {
                Answer::Status(200) => continue,
                Answer::Status(status) => status.to_string(),
                Answer::Unreachable(_) => "unreachable".to_string(),
                Answer::TimedOut => "no answer".to_string(),
            };
            *answers.entry(answer).or_default() += 1;
        }
        if !answers.is_empty() {
            let answers: Vec<String> = answers
                .iter()
                .map(|(answer, count)| format!("{answer} x{count}"))
                .collect();
            kinds.push(format!("{kind}: {}", answers.join(", ")));
        }
    }
    (!kinds.is_empty()).then(|| kinds.join("; "))
}

/// The window's slowest API call, if it took longer than [`SLOW_CALL`]: what, to where, and
/// how long.
fn slowest_call(board: &Board, window: &Window) -> Option<String> {
    let calls = lock(&board.calls);
    let slowest = calls
        .iter()
        .filter(|call| call.at >= window.start && call.at < window.end)
        .max_by_key(|call| call.took)?;
    let what = match slowest.write {
        true => "a rotation",
        false => "a list",
    };
    (slowest.took > SLOW_CALL).then(|| {
        format!(
            "{what} sent to {}, {:.2} s",
            slowest.api,
            slowest.took.as_secs_f64()
        )
    })
}

fn print_totals(board: &Board, rows: &[Row]) {
    let mut acked = 0;
    let mut unanswered = 0;
    let mut unanswered_delivered = 0;
    let mut delivered_once_or_more = 0;
    for queue in &board.queues {
        let published = lock(&queue.published);
        let received = lock(&queue.received);
        let seen: HashSet<u64> = received.deliveries.iter().map(|(_, seq)| *seq).collect();
        acked += published.acks.len();
        unanswered += published.unanswered.len();
        unanswered_delivered += published
            .unanswered
            .iter()
            .filter(|(_, seq)| seen.contains(seq))
            .count();
        delivered_once_or_more += seen.len();
    }
    let lost: usize = rows.iter().map(|row| row.lost).sum();
    let twice: usize = rows.iter().map(|row| row.twice).sum();
    println!(
        "in all: {acked} publishes acknowledged, {lost} of them lost; {delivered_once_or_more} \
         messages delivered, {twice} of them more than once; {unanswered} publishes unanswered \
         ({unanswered_delivered} of them delivered)"
    );
    let mut calls = lock(&board.calls)
        .iter()
        .filter_map(|call| match &call.answer {
            Answer::Unreachable(why) => Some(format!("{} {why}", call.api)),
            _ => None,
        })
        .collect::<Vec<_>>();
    calls.dedup();
    for why in calls.iter().take(3) {
        println!("  an API call unreachable: {why}");
    }
    for (q, queue) in board.queues.iter().enumerate() {
        let published = lock(&queue.published);
        let received = lock(&queue.received);
        for refused in published.refused.iter().take(3) {
            println!("  q{q}: a publish refused: {}", refused.1);
        }
        let cuts = published.cuts.iter().map(|cut| ("publisher", cut));
        for (role, cut) in cuts.chain(received.cuts.iter().map(|cut| ("subscriber", cut))) {
            println!("  q{q}: the {role}'s connection cut: {}", cut.how);
        }
        println!(
            "  q{q}: logins that failed: publisher {}, subscriber {}; the subscriber resumed {} \
             times; acks refused {}",
            published.failed_logins,
            received.failed_logins,
            received.resumed,
            received.acks_refused
        );
    }
}

/// Prints each target with what was measured; whether all were met.
fn targets(windows: &[Window], rows: &[Row]) -> bool {
    let mut checks: Vec<(String, String, bool)> = Vec::new();
    for (window, row) in windows.iter().zip(rows) {
        match window.fault {
            Fault::LeaderKilled | Fault::EtcdLeaderKilled => {
                let what = match window.fault {
                    Fault::LeaderKilled => "the control-plane leader's failover",
                    _ => "the etcd leader's failover",
                };
                checks.push((
                    format!("0 connections cut by {what}"),
                    row.cuts.to_string(),
                    row.cuts == 0,
                ));
            }
            _ => {}
        }
        if window.fault == Fault::EtcdLeaderKilled {
            checks.push((
                "0 API 503s with one etcd member down".into(),
                row.unavailable.to_string(),
                row.unavailable == 0,
            ));
        }
        if let Fault::NodeStopped {
            serving_after,
            target,
        } = window.fault
        {
            let (measured, met) = match serving_after {
                Some(after) => (format!("{:.1} s", after.as_secs_f64()), after <= target),
                None => ("not serving by the run's wait".into(), false),
            };
            checks.push((
                format!(
                    "a SIGSTOPped node's queue serving again within {} s of the SIGSTOP",
                    target.as_secs()
                ),
                measured,
                met,
            ));
        }
    }
    let lost: usize = rows.iter().map(|row| row.lost).sum();
    checks.push((
        "0 acknowledged messages lost".into(),
        lost.to_string(),
        lost == 0,
    ));
    println!();
    println!("{:<72} {:>24}  result", "target", "measured");
    for (target, measured, met) in &checks {
        let result = if *met { "PASS" } else { "MISS" };
        println!("{target:<72} {measured:>24}  {result}");
    }
    checks.iter().all(|(_, _, met)| *met)
}
