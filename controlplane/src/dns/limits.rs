//! Response rate limiting in the manner of BIND's RRL, per source network only (our zone is
//! small, so the query's name adds little): each network has a token bucket, a response costs
//! a token, and tokens come back at [`RATE`] a second up to [`BURST`].
//!
//! Over the budget a UDP query is dropped, except one in [`SLIP`] that is answered truncated
//! (TC=1, no answers): a real resolver then asks over TCP, where its address is proven, while
//! a victim whose address was spoofed gets one small packet per [`SLIP`] sent in its name. A
//! TCP query is charged the same way (the budget covers both), but is made to wait for its
//! token rather than refused, so the way out that slipping points to stays open.
//!
//! The table forgets its oldest source once it holds [`MAX_SOURCES`], so a flood from spoofed
//! addresses, each one new, cannot grow it without bound. Time is passed in.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

/// Responses a second for one source network, UDP and TCP together. A resolver asks an
/// authoritative zone whose answers live a minute far less often than this; a spoofed flood
/// reflected at this rate adds little to what its victim already gets.
pub(super) const RATE: f64 = 100.0;

/// Responses a quiet network may get at once before [`RATE`] applies: one second's worth, so
/// a resolver that starts with a burst of lookups is not cut short.
pub(super) const BURST: f64 = 100.0;

/// Over the budget, one UDP response in `SLIP` is sent truncated and the others dropped
/// (BIND's default): often enough that a real resolver soon moves to TCP, rarely enough that
/// we reflect less than we are sent.
pub(super) const SLIP: u32 = 2;

/// Source networks the table remembers. An entry is under 100 bytes, so a flood from a new
/// spoofed address in every packet holds at most about a megabyte; a source forgotten comes
/// back with a full bucket, which gives a flood at most [`BURST`] more each time.
pub(super) const MAX_SOURCES: usize = 10_000;

/// An IPv4 source's network: its /24, BIND's default, since one operator's hosts (and a
/// spoofer's choices) usually share one.
const IPV4_PREFIX: u32 = 24;

/// An IPv6 source's network: its /56, BIND's default; a single site is given a /56 or a /48,
/// and a host alone may use any address of its /64.
const IPV6_PREFIX: u32 = 56;

/// A client network as the rate limits count them: the address with its host bits cleared.
/// Networks, not addresses, since a UDP source address is only a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Network(IpAddr);

impl Network {
    fn of(ip: IpAddr) -> Network {
        // An IPv4 client reaching a dual-stack socket counts as itself.
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let mask = u32::MAX << (32 - IPV4_PREFIX);
                Network(IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() & mask)))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX << (128 - IPV6_PREFIX);
                Network(IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & mask)))
            }
        }
    }
}

/// What to do with one UDP query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Answer,
    /// Answer truncated: TC=1, the question only.
    Slip,
    Drop,
}

/// Every source network's bucket.
#[derive(Default)]
pub(super) struct RateTable {
    buckets: HashMap<Network, Bucket>,
    /// The networks in the order they were added, the oldest first to go when the table is
    /// full.
    order: VecDeque<Network>,
    /// Sources forgotten since last asked, for the log.
    evicted: u64,
}

struct Bucket {
    /// Responses the source may have now; below zero, TCP queries it is still paying for.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
    /// UDP queries over the budget so far, to slip one in [`SLIP`].
    over: u32,
}

impl RateTable {
    /// The verdict on a UDP query from `ip` at `now`; an answer costs a token.
    pub(super) fn udp(&mut self, ip: IpAddr, now: Instant) -> Verdict {
        let bucket = self.bucket(Network::of(ip), now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Verdict::Answer;
        }
        let slip = bucket.over.is_multiple_of(SLIP);
        bucket.over = bucket.over.wrapping_add(1);
        if slip {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }

    /// Charges a TCP query from `ip` at `now`; returns how long it must wait for the source's
    /// budget to cover it (zero within the budget).
    pub(super) fn tcp(&mut self, ip: IpAddr, now: Instant) -> Duration {
        let bucket = self.bucket(Network::of(ip), now);
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / RATE)
        }
    }

    /// How many sources were forgotten since the last call.
    pub(super) fn take_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.evicted)
    }

    fn bucket(&mut self, network: Network, now: Instant) -> &mut Bucket {
        if !self.buckets.contains_key(&network) {
            self.make_room();
            self.order.push_back(network);
        }
        let bucket = self.buckets.entry(network).or_insert(Bucket {
            tokens: BURST,
            at: now,
            over: 0,
        });
        bucket.refill(now);
        bucket
    }

    fn make_room(&mut self) {
        while self.buckets.len() >= MAX_SOURCES {
            let Some(oldest) = self.order.pop_front() else {
                return;
            };
            self.buckets.remove(&oldest);
            self.evicted += 1;
        }
    }
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        // Two queries may reach the table out of the order their times were read in.
        let elapsed = now.saturating_duration_since(self.at);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * RATE).min(BURST);
        self.at = self.at.max(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The verdicts on `count` UDP queries from `from`, all at `now`.
    fn verdicts(table: &mut RateTable, from: &str, now: Instant, count: usize) -> Vec<Verdict> {
        (0..count).map(|_| table.udp(ip(from), now)).collect()
    }

    #[test]
    fn a_quiet_source_gets_its_burst_then_one_truncated_answer_in_slip_and_the_rest_dropped() {
        let mut table = RateTable::default();
        let now = Instant::now();
        let burst = BURST as usize;
        let got = verdicts(&mut table, "192.0.2.1", now, burst + 6);
        assert!(
            got[..burst].iter().all(|v| *v == Verdict::Answer),
            "{got:?}"
        );
        use Verdict::{Drop, Slip};
        assert_eq!(got[burst..], [Slip, Drop, Slip, Drop, Slip, Drop]);
    }

    #[test]
    fn the_budget_comes_back_at_the_rate_and_no_more_than_the_burst() {
        let mut table = RateTable::default();
        let start = Instant::now();
        verdicts(&mut table, "192.0.2.1", start, BURST as usize);
        assert_ne!(table.udp(ip("192.0.2.1"), start), Verdict::Answer);
        // A tenth of a second brings back a tenth of a second's tokens.
        let later = start + Duration::from_millis(100);
        let got = verdicts(&mut table, "192.0.2.1", later, 11);
        let answered = got.iter().filter(|v| **v == Verdict::Answer).count();
        assert_eq!(answered, (RATE / 10.0) as usize, "{got:?}");
        // A long silence refills the bucket to the burst, not beyond.
        let much_later = later + Duration::from_secs(3600);
        let got = verdicts(&mut table, "192.0.2.1", much_later, BURST as usize + 1);
        let answered = got.iter().filter(|v| **v == Verdict::Answer).count();
        assert_eq!(answered, BURST as usize);
    }

    #[test]
    fn sources_count_by_ipv4_slash_24_and_ipv6_slash_56() {
        let now = Instant::now();
        let exhausted = |table: &mut RateTable, from: &str| {
            verdicts(table, from, now, BURST as usize);
        };
        let mut table = RateTable::default();
        exhausted(&mut table, "192.0.2.1");
        assert_ne!(table.udp(ip("192.0.2.200"), now), Verdict::Answer);
        assert_ne!(table.udp(ip("::ffff:192.0.2.9"), now), Verdict::Answer);
        assert_eq!(table.udp(ip("192.0.3.1"), now), Verdict::Answer);

        exhausted(&mut table, "2001:db8:0:100::1");
        assert_ne!(
            table.udp(ip("2001:db8:0:1ff:ffff::9"), now),
            Verdict::Answer
        );
        assert_eq!(table.udp(ip("2001:db8:0:200::1"), now), Verdict::Answer);
    }

    #[test]
    fn tcp_queries_spend_the_same_budget_and_wait_rather_than_fail_past_it() {
        let mut table = RateTable::default();
        let now = Instant::now();
        let waits: Vec<Duration> = (0..BURST as usize + 2)
            .map(|_| table.tcp(ip("192.0.2.1"), now))
            .collect();
        assert!(waits[..BURST as usize].iter().all(Duration::is_zero));
        let token = Duration::from_secs_f64(1.0 / RATE);
        assert_eq!(waits[BURST as usize..], [token, token * 2]);
        // Its UDP queries find the budget spent until the debt is paid.
        assert_ne!(table.udp(ip("192.0.2.1"), now + token), Verdict::Answer);
        assert_eq!(table.udp(ip("192.0.2.1"), now + token * 3), Verdict::Answer);
    }

    #[test]
    fn the_table_forgets_its_oldest_source_past_its_size() {
        let mut table = RateTable::default();
        let now = Instant::now();
        verdicts(&mut table, "10.0.0.1", now, BURST as usize);
        for n in 0..MAX_SOURCES as u32 {
            let spoofed = IpAddr::V4(Ipv4Addr::from_bits((11 << 24) | (n << 8)));
            table.udp(spoofed, now);
        }
        assert_eq!(table.buckets.len(), MAX_SOURCES);
        assert_eq!(table.order.len(), MAX_SOURCES);
        assert_eq!(table.take_evicted(), 1);
        assert_eq!(table.take_evicted(), 0);
        // Forgotten, the first source starts again with a full bucket.
        assert_eq!(table.udp(ip("10.0.0.1"), now), Verdict::Answer);
        assert_eq!(table.buckets.len(), MAX_SOURCES);
    }
}
