//! A stable 64-bit hash (FNV-1a). Stable across runs, processes and platforms, unlike `std`'s `RandomState`: it
//! decides which worker owns a space and which embedding dimension a word lands in, both of which must be the same
//! on every worker and every restart.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = OFFSET;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Hash of a space name: routes every collection keyed by space to the worker that owns it.
pub fn space_hash(space: &str) -> u64 {
    space_hash_bytes(space.as_bytes())
}

/// FNV-1a finalised with splitmix64, so that every bit (the low one included) is well mixed.
pub fn space_hash_bytes(bytes: &[u8]) -> u64 {
    // Finalise (splitmix64) so that similar names spread evenly over a small number of workers.
    let mut z = fnv1a(bytes);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
