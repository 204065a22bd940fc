//! A TCP proxy between the agents and an API server that must not be stopped (the one a whole
//! test run shares): [`Proxy::cut`] is an outage as the agents see it — every open connection
//! closed, new ones refused, as when the server process dies — and [`Proxy::restore`] brings it
//! back on the same address. TLS passes through untouched (the server's certificate names
//! 127.0.0.1, which the proxy listens on too).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Shared {
    /// Cut: no connection is accepted or relayed.
    cut: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every relayed connection, to close them when cut.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    next_id: AtomicU64,
    /// Connections accepted so far.
    accepted: AtomicU64,
}

pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free loopback port, relaying to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let mut p = Proxy {
            addr,
            upstream,
            shared: Arc::default(),
            acceptor: None,
        };
        p.acceptor = Some(p.accept_on(listener)?);
        Ok(p)
    }

    /// Where the agents connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    fn accept_on(&self, listener: TcpListener) -> Result<std::thread::JoinHandle<()>, String> {
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (shared, upstream) = (self.shared.clone(), self.upstream);
        std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || {
                // Returning drops the listener: while cut, connections are refused.
                while !shared.stop.load(Ordering::Relaxed) && !shared.cut.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => relay(&shared, client, upstream),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(|e| e.to_string())
    }

    /// The outage: stop listening (new connections are refused) and close every open one.
    pub fn cut(&mut self) {
        self.shared.cut.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (_, a, b) in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    /// The server is back: listen on the same address again.
    pub fn restore(&mut self) -> Result<(), String> {
        if self.acceptor.is_some() {
            return Ok(());
        }
        // The port was ours a moment ago; binding it again may race a lingering socket briefly.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(format!("listening on {} again: {e}", self.addr)),
            }
        };
        self.shared.cut.store(false, Ordering::Relaxed);
        self.acceptor = Some(self.accept_on(listener)?);
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

/// Relay `client` ⇄ `upstream` on two threads; the pair is closed when either side ends.
fn relay(shared: &Arc<Shared>, client: TcpStream, upstream: SocketAddr) {
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        return;
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    shared
        .open
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, c2, s2));
    let pipe = |mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>| {
        move || {
            let mut buf = [0u8; 16 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            shared
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(i, _, _)| *i != id);
        }
    };
    let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("proxy-up".into())
        .spawn(pipe(client, server, shared.clone()));
    let _ = std::thread::Builder::new()
        .name("proxy-down".into())
        .spawn(pipe(s3, c3, shared.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_closes_and_refuses_and_a_restore_relays_again() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in echo.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut c = c;
                    let mut buf = [0u8; 64];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 || c.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let mut p = Proxy::start(upstream).unwrap();
        let ping = |c: &mut TcpStream| -> bool {
            let mut b = [0u8; 4];
            c.write_all(b"ping").is_ok() && c.read_exact(&mut b).is_ok() && &b == b"ping"
        };
        let mut open = TcpStream::connect(p.addr()).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(ping(&mut open));
        p.cut();
        assert!(!ping(&mut open), "an open connection is closed by the cut");
        assert!(TcpStream::connect(p.addr()).is_err(), "refused while cut");
        p.restore().unwrap();
        let mut again = TcpStream::connect(p.addr()).unwrap();
        again
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert!(ping(&mut again));
        assert_eq!(p.accepted(), 2);
    }
}
