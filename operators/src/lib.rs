//! engram's memory model and dataflow algorithms.
//!
//! Pure: no sockets, no files, no clocks. Anything that talks to the outside world (an embedding model, an LLM) is
//! reached through a trait defined here and implemented in `engram-connectors`.

pub mod chunk;
pub mod dataflow;
pub mod embed;
pub mod events;
pub mod extractive;
pub mod hash;
pub mod hierarchy;
pub mod hnsw;
pub mod ingest;

/// The operators' maps and sets of node ids, slots and names: foldhash, seeded at random per process, instead of
/// SipHash — several times faster on short keys, and still not a hash a sender can collide on purpose by choosing ids.
pub mod fasthash {
    pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
    pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
}
pub mod lexical;
pub mod llm;
pub mod memory;
pub mod model;
pub mod name;
pub mod record;
pub mod request;
pub mod similarity;
pub mod slots;
pub mod summary;

pub use embed::{Embedder, HashEmbedder};
pub use model::{Edge, Embedding, Node, NodeKind};
pub use name::Name;
pub use record::{parse_record, Limits, Record, Reject};
pub use similarity::{SimilarityIndex, SimilarityParams};
