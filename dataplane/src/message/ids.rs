//! Message and session ids: UUIDv7, strictly increasing per node.
//!
//! The 12 `rand_a` bits hold a counter within one millisecond (the manual's ids show `7000`
//! there for the first id of a millisecond), so ids sort in publish order even when many share
//! a millisecond, and they never go backwards when the clock does.

use std::fmt;
use uuid::Uuid;

/// A message's id. Its order is the order messages were published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageId(pub Uuid);

/// A subscriber session's id; every login gives a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionId(pub Uuid);

/// Ids are compared and hashed as the 128-bit integers they are (big-endian, so the order
/// is the bytes' order): one comparison, where the bytes would take a slice comparison, and
/// one 128-bit write to the hasher.
macro_rules! as_integer {
    ($id:ty) => {
        impl Ord for $id {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.0.as_u128().cmp(&other.0.as_u128())
            }
        }

        impl PartialOrd for $id {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl std::hash::Hash for $id {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                state.write_u128(self.0.as_u128());
            }
        }
    };
}

as_integer!(MessageId);
as_integer!(SessionId);

/// A map keyed by ids, hashed with [`IdHasher`].
pub type IdMap<K, V> = std::collections::HashMap<K, V, BuildIdHasher>;

/// Hashes an id by folding its 128 bits with one multiplication. Not SipHash: the node makes
/// every id it stores, with 62 random bits each, so no client can choose keys that collide
/// (a client only looks ids up).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

pub type BuildIdHasher = std::hash::BuildHasherDefault<IdHasher>;

impl std::hash::Hasher for IdHasher {
    fn write_u128(&mut self, id: u128) {
        const K: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;
        let folded = (id ^ u128::from(self.0)).wrapping_mul(K);
        self.0 = (folded >> 64) as u64 ^ folded as u64;
    }

    /// Only ids are hashed with this; any other key still hashes soundly, byte by byte.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u128(u128::from(byte));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl MessageId {
    /// Parses the text form clients send back; `None` for anything that is not a UUID.
    pub fn parse(text: &str) -> Option<MessageId> {
        Uuid::try_parse(text).ok().map(MessageId)
    }

    /// The id as every frame and reply writes it: lowercase and hyphenated, as `uuid` writes
    /// it. Every message's id is written three times (its delivery, the publish's reply, the
    /// ack's), so its digits are taken eight bytes at a time ([`qe_shared::hex_digits`]).
    pub fn text(self) -> [u8; 36] {
        let bits = self.0.as_u128();
        let high = qe_shared::hex_digits((bits >> 64) as u64);
        let low = qe_shared::hex_digits(bits as u64);
        let mut text = [b'-'; 36];
        text[..8].copy_from_slice(&high[..8]);
        text[9..13].copy_from_slice(&high[8..12]);
        text[14..18].copy_from_slice(&high[12..]);
        text[19..23].copy_from_slice(&low[..4]);
        text[24..].copy_from_slice(&low[4..]);
        text
    }
}

impl SessionId {
    pub fn parse(text: &str) -> Option<SessionId> {
        Uuid::try_parse(text).ok().map(SessionId)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.text();
        f.write_str(std::str::from_utf8(&text).expect("hex digits and hyphens"))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Makes UUIDv7 values that strictly increase.
pub struct IdGenerator {
    /// The millisecond in the last id; can run ahead of the clock by up to a few ms under load
    /// (4096 ids per ms), or when the clock steps back.
    last_ms: u64,
    /// The `rand_a` counter of the last id within `last_ms`.
    counter: u16,
    /// A fast generator for the 62 random bits: ids need to be unique, not secret.
    random: SplitMix64,
}

const COUNTER_MAX: u16 = 0x0FFF;

impl IdGenerator {
    pub fn new() -> IdGenerator {
        let seed = qe_shared::random::bytes::<8>();
        IdGenerator {
            last_ms: 0,
            counter: 0,
            random: SplitMix64(u64::from_le_bytes(seed)),
        }
    }

    /// The next id, for a clock reading of `now_ms` (milliseconds since 1970).
    pub fn next(&mut self, now_ms: u64) -> Uuid {
        if now_ms > self.last_ms {
            self.last_ms = now_ms;
            self.counter = 0;
        } else if self.counter < COUNTER_MAX {
            self.counter += 1;
        } else {
            self.last_ms += 1;
            self.counter = 0;
        }
        let mut bytes = [0u8; 16];
        bytes[..6].copy_from_slice(&self.last_ms.to_be_bytes()[2..]);
        bytes[6] = 0x70 | (self.counter >> 8) as u8;
        bytes[7] = self.counter as u8;
        bytes[8..].copy_from_slice(&self.random.next().to_be_bytes());
        bytes[8] = 0x80 | (bytes[8] & 0x3F); // RFC 9562 variant
        Uuid::from_bytes(bytes)
    }
}

impl IdGenerator {
    /// Makes every later id greater than `id` (one read back from the store at start).
    pub fn observe(&mut self, id: Uuid) {
        let bytes = id.as_bytes();
        let mut ms = [0u8; 8];
        ms[2..].copy_from_slice(&bytes[..6]);
        let ms = u64::from_be_bytes(ms);
        let counter = u16::from_be_bytes([bytes[6] & 0x0F, bytes[7]]);
        if (ms, counter) > (self.last_ms, self.counter) {
            self.last_ms = ms;
            self.counter = counter;
        }
    }
}

impl Default for IdGenerator {
    fn default() -> Self {
        IdGenerator::new()
    }
}

/// SplitMix64: tiny, fast, and good enough for the random tail of an id.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_written_as_uuid_writes_it() {
        let mut random = SplitMix64(7);
        let edges = [0, u128::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210];
        let every_nibble = (0..16u128).fold(0, |n, nibble| n << 8 | nibble << 4 | (15 - nibble));
        let randoms =
            (0..10_000).map(|_| u128::from(random.next()) << 64 | u128::from(random.next()));
        for bits in edges.into_iter().chain([every_nibble]).chain(randoms) {
            let id = MessageId(Uuid::from_u128(bits));
            let expected = id.0.hyphenated().to_string();
            assert_eq!(std::str::from_utf8(&id.text()).unwrap(), expected);
            assert_eq!(id.to_string(), expected);
        }
    }

    #[test]
    fn ids_are_v7_and_start_a_millisecond_at_7000() {
        let mut ids = IdGenerator::new();
        let id = ids.next(1_794_233_033_000);
        assert_eq!(id.get_version_num(), 7);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(&id.hyphenated().to_string()[14..18], "7000");
        let (secs, _) = id.get_timestamp().unwrap().to_unix();
        assert_eq!(secs, 1_794_233_033);
    }

    #[test]
    fn ids_increase_within_a_millisecond_and_when_the_clock_steps_back() {
        let mut ids = IdGenerator::new();
        let mut last = ids.next(5_000);
        for now in [5_000, 5_000, 4_000, 4_999, 5_001, 5_001] {
            let id = ids.next(now);
            assert!(id > last, "{id} after {last}");
            last = id;
        }
        // An id read back from the store, from a clock that ran ahead, still comes first.
        let mut ahead = IdGenerator::new();
        let stored = ahead.next(9_000);
        ids.observe(stored);
        let id = ids.next(7_000);
        assert!(id > stored);
        last = id;
        // More than 4096 in one millisecond borrows the next millisecond.
        for _ in 0..10_000 {
            let id = ids.next(6_000);
            assert!(id > last);
            last = id;
        }
    }
}
