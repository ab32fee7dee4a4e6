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

/// Routes by [`mixed`], so that similar names spread evenly over a small number of workers.
pub fn space_hash_bytes(bytes: &[u8]) -> u64 {
    mixed(bytes)
}

/// FNV-1a finalised with splitmix64, so that every bit is well mixed. Use it wherever a hash is reduced modulo a
/// small number (buckets, workers): FNV-1a's low `b` bits depend only on the low `b` bits of each step, so modulo
/// 2^b it is a machine of 2^b states, and two strings whose prefixes reach one state collide on every common
/// suffix — `t17w3` and `t912w3` for every `w…` at once.
pub fn mixed(bytes: &[u8]) -> u64 {
    let mut z = fnv1a(bytes);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The content key of `bytes`: BLAKE3 over them, cut to 160 bits. Every content key of the memory — cluster
/// summaries, sessions, co-reference pairs, query-time calls, cluster and event ids, logged embeddings — is this
/// function over the content's bytes, so logged replies stay keyed across restarts. A cryptographic hash, because
/// the content is the senders' text: with a hash anyone can collide on purpose, one sender's content could be served
/// another's logged reply, or two events share an id.
pub fn content_key(bytes: &[u8]) -> [u8; 20] {
    let mut out = [0u8; 20];
    out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..20]);
    out
}

/// [`content_key`] as 40 hex digits.
pub fn content_hex(bytes: &[u8]) -> String {
    hex(&content_key(bytes))
}

/// BLAKE3 cut to 96 bits, as 24 hex digits: the shorter form derived ids (clusters, events) use.
pub fn content_hex96(bytes: &[u8]) -> String {
    hex(&blake3::hash(bytes).as_bytes()[..12])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The content key logs written before [`content_key`] used: FNV-1a over the bytes and over them reversed, as 32
/// hex digits. Read only, to find an old log's reply for a request ([`crate::request::legacy_key`]); never written.
pub fn legacy_content_hex(bytes: &[u8]) -> String {
    let rev: Vec<u8> = bytes.iter().rev().copied().collect();
    format!("{:016x}{:016x}", fnv1a(bytes), fnv1a(&rev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_keys_are_blake3_and_legacy_keys_fnv_forwards_and_backwards() {
        // BLAKE3("abc") begins 6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85.
        assert_eq!(content_hex(b"abc"), "6437b3ac38465133ffb63b75273a8db548c55846");
        assert_eq!(content_hex96(b"abc"), "6437b3ac38465133ffb63b75");
        assert_eq!(legacy_content_hex(b"ab"), format!("{:016x}{:016x}", fnv1a(b"ab"), fnv1a(b"ba")));
    }

    #[test]
    fn known_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// Words of 4,000 vocabularies `t<topic>w<k>` (k < 25) into 1,024 buckets: bucketed by plain FNV-1a, whole
    /// vocabularies land on the same 25 buckets (1,010 distinct bucket sequences); mixed, every vocabulary has its own.
    #[test]
    fn mixed_low_bits_do_not_follow_the_prefix() {
        let sequences = |h: fn(&[u8]) -> u64| {
            (0..4000)
                .map(|t| (0..25).map(|k| h(format!("t{t}w{k}").as_bytes()) % 1024).collect::<Vec<_>>())
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        assert!(sequences(fnv1a) < 1100);
        assert_eq!(sequences(mixed), 4000);
    }
}
