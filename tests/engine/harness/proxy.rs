//! A TCP proxy that can cut a worker off from its database: while down it
//! drops every forwarded connection and closes new ones at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: String,
    up: Arc<AtomicBool>,
    /// Bumped on every cut: forwarders of an older generation close.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a random local port, forwarding to `upstream`.
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let task = tokio::spawn(accept(listener, upstream, up.clone(), generation.clone()));
        Proxy {
            addr,
            up,
            generation,
            task,
        }
    }

    /// Cut every connection and refuse new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: String,
    up: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if !up.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let mut gen_rx = generation.subscribe();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let (mut client, mut server) = (client, server);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = gen_rx.changed() => {}
            }
            // Dropping both sockets closes them: the worker sees a dead
            // connection, the server ends its backend.
        });
    }
}
