//! An AF_PACKET socket on one interface, opened for one probe or announcement and closed after.
//!
//! It binds with ETH_P_ALL so it sees frames before any rx_handler (ipvlan, macvlan, bridge) can steer
//! them to a slave, and a classic BPF filter keeps everything but ARP and/or ICMPv6 in the kernel, so a
//! busy NIC does not flood it. It never sets promiscuous mode.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::frame::{ETHERTYPE_ARP, ETHERTYPE_IPV6};

/// Which frames the socket lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Arp,
    Icmpv6,
    /// Both: one socket probing IPv4 and IPv6 addresses.
    ArpOrIcmpv6,
}

impl Filter {
    /// The filter that lets through what `self` and `other` do.
    pub fn with(self, other: Filter) -> Filter {
        if self == other {
            self
        } else {
            Filter::ArpOrIcmpv6
        }
    }
}

pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn bpf(filter: Filter) -> Vec<libc::sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    const LDH: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const LDB: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    match filter {
        Filter::Arp => vec![
            op(LDH, 0, 0, 12),
            op(JEQ, 0, 1, u32::from(ETHERTYPE_ARP)),
            op(RET, 0, 0, 0xffff),
            op(RET, 0, 0, 0),
        ],
        // IPv6 with next header ICMPv6 (no extension headers: NDP never carries them).
        Filter::Icmpv6 => vec![
            op(LDH, 0, 0, 12),
            op(JEQ, 0, 3, u32::from(ETHERTYPE_IPV6)),
            op(LDB, 0, 0, 20),
            op(JEQ, 0, 1, 58),
            op(RET, 0, 0, 0xffff),
            op(RET, 0, 0, 0),
        ],
        Filter::ArpOrIcmpv6 => vec![
            op(LDH, 0, 0, 12),
            op(JEQ, 3, 0, u32::from(ETHERTYPE_ARP)),
            op(JEQ, 0, 3, u32::from(ETHERTYPE_IPV6)),
            op(LDB, 0, 0, 20),
            op(JEQ, 0, 1, 58),
            op(RET, 0, 0, 0xffff),
            op(RET, 0, 0, 0),
        ],
    }
}

fn attach(fd: &OwnedFd, filter: Filter) -> io::Result<()> {
    let prog = bpf(filter);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut _,
    };
    // SAFETY: `fprog` and the program it points to outlive the call; the kernel copies the filter.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })
    .map(drop)
}

impl PacketSocket {
    pub fn open(ifindex: u32, filter: Filter) -> io::Result<PacketSocket> {
        let ifindex =
            i32::try_from(ifindex).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Protocol 0 receives nothing until bound, so no unfiltered frame is queued before the filter.
        let fd =
            // SAFETY: plain socket(2); the fd is owned on the next line.
            cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `fd` was just returned by socket(2) and has no other owner.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        attach(&fd, filter)?;
        // SAFETY: sockaddr_ll is plain old data, valid all zero.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a live sockaddr_ll and its size is passed with it.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket { fd, ifindex })
    }

    /// Let other frames through from now on (replaces the filter; frames already queued stay).
    pub fn set_filter(&self, filter: Filter) -> io::Result<()> {
        attach(&self.fd, filter)
    }

    /// Send one complete Ethernet frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data, valid all zero.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: `frame` and `sll` are live for the call, passed with their lengths.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// A frame already queued (our own outgoing frames are skipped), without waiting.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data, valid all zero.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are live and writable for the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => return Ok(None),
                    _ => return Err(e),
                }
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }

    /// Ask for a receive queue of `bytes`, past the system's rmem_max (SO_RCVBUFFORCE: needs
    /// CAP_NET_ADMIN, which the node-agent has).
    pub fn set_recv_buffer(&self, bytes: usize) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: `v` is a live c_int and its size is passed with it.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// Frames the kernel dropped for a full queue since the last call (reading resets the
    /// kernel's counters).
    pub fn drops(&self) -> io::Result<u64> {
        // SAFETY: tpacket_stats is plain old data, valid all zero.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` is live and writable for `len` bytes.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        })?;
        Ok(u64::from(st.tp_drops))
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// poll(2) for at most `timeout` (at least 1 ms, so a sub-millisecond wait does not spin); EINTR is a
/// normal early return.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live slice of pollfd and its length is passed.
    if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Spread `attempts` sends over `budget`, the first at once.
pub fn schedule(budget: Duration, attempts: u32) -> Vec<Duration> {
    let attempts = attempts.max(1);
    (0..attempts).map(|i| budget * i / attempts).collect()
}

/// A link as a probe needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub index: u32,
    /// None unless the link is Ethernet.
    pub mac: Option<crate::frame::Mac>,
    /// Administratively up (IFF_UP).
    pub up: bool,
}

/// Look up the link `name` in the calling thread's netns; None if there is none. Three ioctls on a
/// throwaway AF_UNIX socket, where an rtnetlink request would open a netlink socket and build and
/// parse a full link message: this is on the path of every probing ADD.
pub fn link_facts(name: &str) -> io::Result<Option<LinkFacts>> {
    // SAFETY: ifreq is plain old data, valid all zero.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains('\0') {
        return Ok(None);
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe {
        OwnedFd::from_raw_fd(cvt(libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?)
    };
    let ioctl = |req: &mut libc::ifreq, request| {
        // SAFETY: `req` is a whole ifreq naming the link; each request fills the member of
        // `ifr_ifru` that is read after it.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request as _, req as *mut libc::ifreq) })
    };
    match ioctl(&mut req, libc::SIOCGIFINDEX) {
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(None),
        r => r?,
    };
    // SAFETY: SIOCGIFINDEX succeeded and filled ifru_ifindex.
    let index = unsafe { req.ifr_ifru.ifru_ifindex } as u32;
    ioctl(&mut req, libc::SIOCGIFFLAGS)?;
    // SAFETY: SIOCGIFFLAGS succeeded and filled ifru_flags.
    let up = unsafe { req.ifr_ifru.ifru_flags } as libc::c_int & libc::IFF_UP != 0;
    ioctl(&mut req, libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR succeeded and filled ifru_hwaddr.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mac =
        (hw.sa_family == libc::ARPHRD_ETHER).then(|| std::array::from_fn(|i| hw.sa_data[i] as u8));
    Ok(Some(LinkFacts { index, mac, up }))
}

#[cfg(test)]
mod interface_tests {
    use super::*;

    #[test]
    fn loopback_and_absent_links() {
        let lo = link_facts("lo").unwrap().expect("every netns has lo");
        assert_eq!((lo.index, lo.mac), (1, None));
        assert_eq!(link_facts("tether-none0").unwrap(), None);
        assert_eq!(link_facts("").unwrap(), None);
        assert_eq!(link_facts("a-name-longer-than-ifnamsiz").unwrap(), None);
    }
}
