//! WATCH: chunked JSON event lines, the initial `ADDED` events or the replayed history, and the
//! `410 Expired` end of every open watch on demand.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Response;
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use crate::objects::{Event, Kind, Stored};
use crate::response::{Resp, bad_request, metadata_json, status, status_value};
use crate::selector::Filter;
use crate::shared::Shared;

/// Pseudo event type: every open watch ends with a `410 Expired` ERROR event.
const EXPIRE: &str = "EXPIRE";
const MAX_WATCH_S: u64 = 1800;

struct ChanBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn event_line_as(type_: &str, obj: &Stored, meta_only: bool) -> Bytes {
    if meta_only {
        let m = Stored {
            value: Value::Null,
            json: metadata_json(obj, false),
        };
        event_line(type_, &m)
    } else {
        event_line(type_, obj)
    }
}

fn event_line(type_: &str, obj: &Stored) -> Bytes {
    let mut v = Vec::with_capacity(obj.json.len() + 32);
    v.extend_from_slice(format!("{{\"type\":\"{type_}\",\"object\":").as_bytes());
    v.extend_from_slice(&obj.json);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

pub(crate) fn watch_objects(
    sh: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    q: &BTreeMap<String, String>,
    meta_only: bool,
) -> Resp {
    let filter = match Filter::parse(kind, ns, q) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(MAX_WATCH_S)
        .min(MAX_WATCH_S);
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let mut rx = sh.events.subscribe();
    let (initial, from_rv): (Vec<Bytes>, u64) = {
        let st = sh.state();
        if rv_param.is_empty() || rv_param == "0" {
            let map = match kind {
                Kind::Lease => &st.leases,
                Kind::Pod => &st.pods,
                Kind::Node => &st.nodes,
            };
            let lines = map
                .values()
                .filter(|o| filter.accepts(&o.value))
                .map(|o| event_line_as("ADDED", o, meta_only))
                .collect();
            (lines, st.rv)
        } else {
            let Ok(want) = rv_param.parse::<u64>() else {
                return bad_request(&format!("invalid resource version {rv_param:?}"));
            };
            if want < st.history_floor {
                return status(
                    410,
                    "Expired",
                    &format!("too old resource version: {want} ({})", st.rv),
                    Value::Null,
                );
            }
            let lines = st
                .history
                .iter()
                .filter(|e| e.kind == kind && e.rv > want && filter.accepts(&e.obj.value))
                .map(|e| event_line_as(e.type_, &e.obj, meta_only))
                .collect();
            (lines, st.rv.max(want))
        }
    };
    let (tx, body_rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for line in initial {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.type_ == EXPIRE {
                            let st = Stored::new(status_value(410, "Expired", "too old resource version (the double expired every watch)", Value::Null));
                            let _ = tx.send(event_line("ERROR", &st)).await;
                            return;
                        }
                        if ev.kind != kind || ev.rv <= from_rv || !filter.accepts(&ev.obj.value) {
                            continue;
                        }
                        if tx.send(event_line_as(ev.type_, &ev.obj, meta_only)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let st = Stored::new(status_value(410, "Expired", "watch fell behind; re-list", Value::Null));
                        let _ = tx.send(event_line("ERROR", &st)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(ChanBody(body_rx).boxed())
        .expect("valid response")
}

pub(crate) fn expire_watches(sh: &Shared) {
    let mut st = sh.state();
    st.history.clear();
    st.history_floor = st.rv;
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_: EXPIRE,
        rv: st.rv,
        obj: Stored::new(Value::Null),
    });
    // Not recorded in the history: it only ends the watches open now.
    let _ = sh.events.send(ev);
}
