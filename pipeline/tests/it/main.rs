//! The engine's integration tests, as one test binary: the whole engine (candle, librdkafka, axum, …) is linked once
//! instead of once per file, which saves minutes of linking and gigabytes of disk.

mod common;

mod access;
mod bench_scale;
mod browser;
mod cluster;
mod embedders;
mod eval;
mod events;
mod events_llm;
mod faults;
mod hierarchy;
mod hostile;
mod http_api;
mod kafka;
mod llm;
mod logs;
mod mcp;
mod real_llm;
