//! The hash of the tables keyed by call ids and proc ranks (the calls in flight of a
//! connection, of a relay, of a worker's resumable stream): a multiply per integer
//! (the Fx hash), not SipHash's rounds, which cost as much as the rest of a reply's
//! bookkeeping at 1,024 replies per call. Their keys come from authenticated peers
//! (a wrong token never reaches them), so SipHash's resistance to chosen keys buys
//! nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The Fx hash: each integer written is mixed in with a rotate, a xor and a multiply.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` keyed by ids (see the module doc).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_ids_spread_over_the_tables_top_and_bottom_bits() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let start = 0x7f3a_0000_0000_u64;
        let low: std::collections::HashSet<u64> = (0..1024)
            .map(|i| build.hash_one(start + i) & 1023)
            .collect();
        let top: std::collections::HashSet<u64> =
            (0..1024).map(|i| build.hash_one(start + i) >> 57).collect();
        assert!(low.len() > 600, "{} of 1,024 low slots", low.len());
        assert!(top.len() > 100, "{} of 128 top-7-bit tags", top.len());
        let mut m: IdMap<(u64, u32), u32> = IdMap::default();
        for i in 0..1024u32 {
            m.insert((start, i), i);
        }
        assert!((0..1024u32).all(|i| m.get(&(start, i)) == Some(&i)));
    }
}
