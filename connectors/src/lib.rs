//! engram's I/O: sources, the durable input log, the dead-letter sink.

pub mod dead_letter;
pub mod embedders;
pub mod file_source;
pub mod input_log;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod openai;
pub mod source;

pub use dead_letter::DeadLetter;
pub use file_source::{FileSource, StdinSource};
pub use input_log::{InputLog, LoggedResponse, ResponseLog};
pub use source::{Position, Source, SourceBatch, SourceRecord};
