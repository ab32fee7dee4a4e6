//! The API's accept loop: HTTP/1.1 connections with a header read timeout and a cap on open connections (what
//! `axum::serve` does not expose), and a graceful stop that lets requests in progress finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// The bounds of one listener.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Longest a client may take to send a request's headers; past it the connection is closed.
    pub header_read_timeout: Duration,
    /// Most open connections; past it new ones wait in the listener's accept queue.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `stop` resolves, then closes idle connections, lets requests in progress
/// finish, and returns.
pub async fn serve(listener: TcpListener, app: axum::Router, limits: ConnLimits, stop: impl Future<Output = ()>) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (close, closing) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, a connection reset before it was accepted: wait a little, go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut closing = closing.clone();
        connections.spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                // A client that shuts its write side after its request still gets the reply.
                .half_close(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let stopping = async move {
                let _ = closing.wait_for(|c| *c).await;
            };
            tokio::select! {
                _ = conn.as_mut() => {}
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = close.send(true);
    while connections.join_next().await.is_some() {}
}
