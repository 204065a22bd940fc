//! The server itself: how to start it (`Options`) and the accept loop (plain HTTP/1.1 on
//! 127.0.0.1) that hands every request to the router. `ApiServerDouble` (double.rs) runs it on
//! its own thread and tokio runtime.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::routing::handle;
use crate::shared::Shared;

/// How to start the double.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Delay added before answering each API request (not the control endpoints).
    pub latency: Duration,
    /// Whether the IPLease CRD is installed (false: its group answers 404).
    pub crd_installed: bool,
    /// Worker threads of the double's own runtime.
    pub worker_threads: usize,
    /// User name quoted in 403 messages.
    pub user: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            latency: Duration::ZERO,
            crd_installed: true,
            worker_threads: 2,
            user: "system:serviceaccount:kube-system:tether".to_string(),
        }
    }
}

/// Accept connections on `listener` and serve each on its own task until `stop` fires.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let sh = shared.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let sh = sh.clone();
                            async move { Ok::<_, Infallible>(handle(sh, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Err(e) => {
                    log::warn!("apiserver double: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}
