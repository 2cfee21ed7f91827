//! A TCP proxy that can stop forwarding without closing anything: a
//! database or broker that holds its connections open and says nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to PostgreSQL that forwards until it is told to hold.
pub struct Proxy {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    hole: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target` (`HOST:PORT`).
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hole = Arc::new(AtomicBool::new(false));
        let held = hole.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (hole, target) = (held.clone(), target.clone());
                tokio::spawn(async move {
                    // A connection made during the black hole waits, unanswered.
                    while hole.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let Ok(outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(forward(ri, wo, hole.clone()));
                    tokio::spawn(forward(ro, wi, hole));
                });
            }
        });
        Proxy { port, hole }
    }

    /// Stops (true) or resumes (false) forwarding; nothing is closed.
    pub fn hold(&self, on: bool) {
        self.hole.store(on, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, holding what it read while the hole is on.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while hole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
