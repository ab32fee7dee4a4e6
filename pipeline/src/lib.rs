//! engram's pipeline: configuration, the engine (timely wiring and epochs), views, the HTTP API, metrics, and the
//! bench command. The `engram` binary is a thin CLI over this library.

pub mod ann;
pub mod auth;
pub mod bench;
pub mod client;
pub mod config;
pub mod engine;
pub mod eval;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod outputs;
pub mod query;
pub mod score;
pub mod server;
pub mod service;
pub mod views;
