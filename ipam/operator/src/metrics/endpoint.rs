//! The metrics endpoint: a small HTTP server on its own thread answering `GET /metrics` (the
//! registry rendered), `GET /healthz` (liveness) and `GET /readyz` (readiness), one connection at
//! a time.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Registry;
use crate::installed::Installed;
use crate::report::now_s;

/// Serve `registry` on `listener` until `stop`: `GET /metrics`, `GET /healthz`, `GET /readyz`
/// (anything else: 404). One connection at a time, each bounded by a 5 s timeout: a scrape every
/// few seconds is the load.
pub fn serve(
    listener: TcpListener,
    registry: &Registry,
    installed: Option<&Installed>,
    stop: &AtomicBool,
) {
    if let Err(e) = listener.set_nonblocking(true) {
        log::error!("metrics: {e}; not serving");
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                if let Err(e) = answer(conn, registry, installed) {
                    log::debug!("metrics: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => {
                log::warn!("metrics: accepting a connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn answer(
    conn: TcpStream,
    registry: &Registry,
    installed: Option<&Installed>,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers are not needed; read them so the client is not reset before its answer.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", registry.render()),
        ("GET", "/healthz") => match registry.health(now_s()) {
            Ok(()) => ("200 OK", "ok\n".to_string()),
            Err(e) => ("503 Service Unavailable", format!("{e}\n")),
        },
        // Ready: alive, and (an agent) what it installed is in place.
        ("GET", "/readyz") => match registry
            .health(now_s())
            .and_then(|()| installed.map_or(Ok(()), Installed::check))
        {
            Ok(()) => ("200 OK", "ok\n".to_string()),
            Err(e) => ("503 Service Unavailable", format!("{e}\n")),
        },
        ("GET", _) => (
            "404 Not Found",
            "tether node-agent: metrics are at /metrics, health at /healthz, readiness at /readyz\n"
                .to_string(),
        ),
        _ => ("405 Method Not Allowed", String::new()),
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// `--metrics-addr`: `IP:PORT`, `[IPv6]:PORT`, a bare IPv6 address followed by `:PORT` (so that
/// `$(POD_IP):9464` works on IPv6 nodes too), or `:PORT` for every IPv4 interface.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || format!("{s:?} is not IP:PORT (e.g. 0.0.0.0:9464, [::]:9464, :9464)");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let ip: std::net::IpAddr = if host.is_empty() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        host.parse().map_err(|_| bad())?
    };
    Ok(SocketAddr::new(ip, port))
}

/// Bind `addr` and serve on a thread of its own; the bound address (port 0 picks one).
pub fn start(
    addr: SocketAddr,
    registry: std::sync::Arc<Registry>,
    installed: Option<Installed>,
    stop: std::sync::Arc<AtomicBool>,
) -> std::io::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let h = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(listener, &registry, installed.as_ref(), &stop))?;
    Ok((bound, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::STALL_S;

    #[test]
    fn listen_addresses() {
        for (text, want) in [
            ("0.0.0.0:9464", "0.0.0.0:9464"),
            (":9464", "0.0.0.0:9464"),
            ("[::]:9464", "[::]:9464"),
            ("fd00:1::7:9464", "[fd00:1::7]:9464"),
            ("10.0.0.7:9464", "10.0.0.7:9464"),
        ] {
            assert_eq!(parse_listen_addr(text).unwrap().to_string(), want, "{text}");
        }
        for bad in ["9464", "host:9464", "10.0.0.7:", "10.0.0.7:99999", ""] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serves_metrics_over_http() {
        let r = std::sync::Arc::new(Registry::default());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (addr, h) = start(
            "127.0.0.1:0".parse().unwrap(),
            r.clone(),
            None,
            stop.clone(),
        )
        .unwrap();
        let get = |path: &str| {
            let mut c = TcpStream::connect(addr).unwrap();
            write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n").unwrap();
            let mut s = String::new();
            std::io::Read::read_to_string(&mut c, &mut s).unwrap();
            s
        };
        let m = get("/metrics");
        assert!(
            m.starts_with("HTTP/1.1 200 OK\r\n")
                && m.contains("text/plain; version=0.0.4")
                && m.contains("# TYPE tether_pool_size gauge"),
            "{m}"
        );
        assert!(get("/").starts_with("HTTP/1.1 404"));
        // Health: fine while starting and while the loop beats; 503 once it stops.
        assert!(get("/healthz").starts_with("HTTP/1.1 200 OK"));
        assert!(get("/readyz").starts_with("HTTP/1.1 200 OK"));
        let now = now_s();
        r.beat(now);
        assert!(get("/healthz").starts_with("HTTP/1.1 200 OK"));
        r.beat(now - STALL_S - 5);
        let stalled = get("/healthz");
        assert!(
            stalled.starts_with("HTTP/1.1 503") && stalled.contains("no progress for"),
            "{stalled}"
        );
        // A wedged agent is not ready either.
        assert!(get("/readyz").starts_with("HTTP/1.1 503"));
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }
}
