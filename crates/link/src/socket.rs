//! A synchronous rtnetlink socket: one request at a time, replies matched by sequence number.
//!
//! A CNI plugin does a handful of round trips and exits, so there is nothing to overlap and no reason
//! for an async runtime. The socket belongs to the netns of the thread that opened it and keeps it.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket as NlSocket, protocols::NETLINK_ROUTE};

/// Dumps interrupted by a concurrent change (NLM_F_DUMP_INTR) are retried this many times.
const DUMP_ATTEMPTS: usize = 5;
/// Large enough for any datagram the kernel builds for a dump (it caps them at 32 KiB).
const RECV_BUF: usize = 64 * 1024;

/// Why a request failed, before the caller names the operation.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel answered with this (positive) errno.
    Errno(i32),
    /// The socket itself failed.
    Io(io::Error),
    /// A reply we could not read.
    Protocol(String),
}

pub(crate) struct Socket {
    sock: NlSocket,
    seq: Cell<u32>,
}

impl Socket {
    /// A socket in the calling thread's netns.
    pub(crate) fn open() -> io::Result<Socket> {
        let mut sock = NlSocket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        // The kernel then filters dumps by the header's fields (an address dump by ifindex, a route
        // dump by table) instead of sending everything.
        sock.set_netlink_get_strict_chk(true)?;
        Ok(Socket {
            sock,
            seq: Cell::new(0),
        })
    }

    fn send(&self, msg: RouteNetlinkMessage, flags: u16) -> Result<u32, Failure> {
        let seq = self.seq.get().wrapping_add(1);
        self.seq.set(seq);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(Failure::Io)?;
        Ok(seq)
    }

    fn recv(&self, buf: &mut Vec<u8>) -> Result<(), Failure> {
        buf.clear();
        loop {
            // SAFETY: recv(2) writes at most `capacity` bytes into the vector's own allocation.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.capacity(),
                    libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Failure::Io(e));
            }
            let n = n as usize;
            if n > buf.capacity() {
                return Err(Failure::Protocol(format!(
                    "a {n}-byte reply does not fit the {}-byte buffer",
                    buf.capacity()
                )));
            }
            // SAFETY: the kernel wrote `n` bytes, and `n <= capacity` was checked above.
            unsafe { buf.set_len(n) };
            return Ok(());
        }
    }

    /// Send `msg` and collect its replies: until the ACK for a plain request (NLM_F_ACK is added), until
    /// NLMSG_DONE for a dump. Returns the replies and whether a dump was interrupted.
    fn exchange(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<(Vec<RouteNetlinkMessage>, bool), Failure> {
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let seq = self.send(msg, if dump { flags } else { flags | NLM_F_ACK })?;
        let mut out = Vec::new();
        let mut interrupted = false;
        let mut buf = Vec::with_capacity(RECV_BUF);
        loop {
            self.recv(&mut buf)?;
            let mut off = 0;
            while off < buf.len() {
                let len = NetlinkBuffer::new_checked(&buf[off..])
                    .map_err(|e| Failure::Protocol(format!("bad netlink header: {e}")))?
                    .length() as usize;
                let raw = &buf[off..off + len];
                off += (len + 3) & !3;
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw)
                    .map_err(|e| Failure::Protocol(format!("unreadable reply: {e}")))?;
                if msg.header.sequence_number != seq {
                    continue; // a late reply to an earlier request
                }
                interrupted |= msg.header.flags & NLM_F_DUMP_INTR != 0;
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok((out, interrupted)),
                            Some(c) => Err(Failure::Errno(c.get().abs())),
                        };
                    }
                    NetlinkPayload::Done(d) if d.code != 0 => {
                        return Err(Failure::Errno(d.code.abs()));
                    }
                    NetlinkPayload::Done(_) => return Ok((out, interrupted)),
                    _ => {}
                }
            }
        }
    }

    /// A request that is acknowledged (and may return objects, e.g. a GET by name).
    pub(crate) fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, Failure> {
        self.exchange(msg, flags).map(|(v, _)| v)
    }

    /// A dump, retried when a concurrent change interrupted it (its view may be inconsistent).
    pub(crate) fn dump(
        &self,
        msg: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, Failure> {
        for _ in 0..DUMP_ATTEMPTS {
            let (v, interrupted) = self.exchange(msg.clone(), NLM_F_DUMP)?;
            if !interrupted {
                return Ok(v);
            }
            log::debug!("netlink dump interrupted by a concurrent change; retrying");
        }
        Err(Failure::Protocol(format!(
            "dump interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row"
        )))
    }
}
