//! Stable hashes for names and walk offsets: the same input gives the same value in every
//! process and every tether version, because file names, object names, link names and walk
//! orders depend on them (std's hasher promises neither).

/// 64-bit FNV-1a of `bytes`, seeded (stable across processes and versions).
pub fn fnv1a64(bytes: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A 64-bit finaliser (splitmix64's): spreads the bits of `z` over the whole word.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_is_the_standard_one_and_never_changes() {
        // Published FNV-1a test vectors (seed 0): state file names and journal entries depend
        // on these values, so they must stay the same across versions.
        assert_eq!(fnv1a64(b"", 0), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a", 0), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar", 0), 0x8594_4171_f739_67e8);
        assert_ne!(fnv1a64(b"a", 1), fnv1a64(b"a", 0));
        assert_eq!(mix64(0), 0);
    }
}
