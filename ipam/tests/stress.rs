//! Many tether-ipam processes at once, and processes killed mid-flight: the node-local store must
//! never hand out an address twice, never be left unreadable, and never lose track of a lease.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The two tests here each start hundreds of processes; running them one at a time keeps each one's
/// timing (and the crash test's calibration) meaningful on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Start `n` processes of `verb` with stdin held open, then feed them all at once, so they really run
/// concurrently (the config arrives within microseconds for all of them).
fn start_together(net: &Net, verb: &str, atts: &[Att]) -> Vec<Child> {
    let conf = net.conf().to_string();
    let mut children: Vec<Child> = atts
        .iter()
        .map(|a| {
            let mut c = net.command(verb, Some(a));
            c.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().expect("spawn")
        })
        .collect();
    for ch in &mut children {
        let mut stdin = ch.stdin.take().unwrap();
        stdin.write_all(conf.as_bytes()).unwrap();
    }
    children
}

fn finish(what: &str, ch: Child) -> Out {
    let o = ch.wait_with_output().unwrap();
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
        what: what.into(),
    }
}

/// 256 ADD processes started at once on one network whose range has exactly 256 addresses → 256
/// distinct addresses, every one leased to the process that got it; then 256 DELs at once → nothing
/// leased. (Probing off; the point is the store's concurrency.)
#[test]
fn concurrent_256_adds_then_256_dels() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(json!({"range": "10.1.0.1-10.1.1.0/23", "cooldown_s": 0}));
    let atts: Vec<Att> = (0..256).map(|i| Att::new(&format!("pod{i:03}"))).collect();
    let t = Instant::now();
    let children = start_together(&net, "ADD", &atts);
    let mut got: BTreeMap<std::net::IpAddr, String> = BTreeMap::new();
    for (a, ch) in atts.iter().zip(children) {
        let out = finish(&format!("ADD {}", a.container_id), ch);
        let ip = out.ip();
        assert!(
            got.insert(ip, a.container_id.clone()).is_none(),
            "{ip} handed out twice"
        );
    }
    eprintln!("256 concurrent ADDs: {:?}", t.elapsed());
    assert_eq!(got.len(), 256);
    assert_eq!(
        got.keys().copied().collect::<BTreeSet<_>>(),
        span("10.1.0.1", "10.1.1.0")
    );
    let leased = net.leased();
    assert_eq!(leased.len(), 256);
    for (ip, cid) in &got {
        assert_eq!(
            &leased[ip].0, cid,
            "the store and the Result disagree about {ip}"
        );
    }
    net.status().expect_err(50);

    let t = Instant::now();
    let children = start_together(&net, "DEL", &atts);
    for (a, ch) in atts.iter().zip(children) {
        let out = finish(&format!("DEL {}", a.container_id), ch);
        assert!(out.ok() && out.stdout.trim().is_empty(), "{out}");
    }
    eprintln!("256 concurrent DELs: {:?}", t.elapsed());
    assert!(net.leased().is_empty(), "{:?}", net.leased());
    net.status().expect_ok();
}

/// A small xorshift PRNG; the seed is printed so a failure can be replayed (TETHER_CRASH_SEED).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// ADD and DEL processes SIGKILLed at random moments, 200 times. Afterwards the store opens cleanly
/// (ADD works), no address is leased twice, no attachment holds two addresses of one range, and DEL of
/// every container releases everything.
#[test]
fn sigkill_at_random_moments_never_corrupts_the_store() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seed = std::env::var("TETHER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("TETHER_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    // Dual-stack, so an ADD writes twice and a kill can land between the two claims.
    let net = Net::new(
        json!({"range": "10.1.2.0/26", "ipRanges": [{"range": "fd00:1:2::/120"}], "cooldown_s": 0}),
    );
    let pool: Vec<Att> = (0..24)
        .map(|i| Att::new(&format!("crash{i:02}")).pod("ns", &format!("p{i}"), &format!("u{i}")))
        .collect();

    // How long one ADD takes here, to spread the kills over a process's whole life.
    let t = Instant::now();
    net.add(&Att::new("warmup")).expect_ok();
    net.del(&Att::new("warmup")).expect_ok();
    let life = (t.elapsed() / 2).max(Duration::from_millis(2));
    eprintln!("one call takes about {life:?}");

    let (mut kills, mut completed, mut rounds) = (0usize, 0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while kills < 200 {
        assert!(Instant::now() < deadline, "only {kills} kills in 60 s");
        rounds += 1;
        // A batch of distinct attachments (the runtime never runs two calls for one attachment at once).
        let mut idx: Vec<usize> = (0..pool.len()).collect();
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let batch = 1 + rng.below(4) as usize;
        let mut children: Vec<Child> = idx[..batch]
            .iter()
            .map(|&i| net.spawn(if rng.below(3) == 0 { "DEL" } else { "ADD" }, &pool[i]))
            .collect();
        let wait = Duration::from_micros(rng.below(life.as_micros() as u64 * 3 / 2 + 1));
        std::thread::sleep(wait);
        for ch in &mut children {
            if ch.try_wait().unwrap().is_none() && rng.below(4) != 0 {
                ch.kill().unwrap(); // SIGKILL
                kills += 1;
            }
        }
        for ch in children {
            let o = ch.wait_with_output().unwrap();
            if o.status.code().is_some() {
                completed += 1;
                // A call that ran to the end succeeded, or failed cleanly (e.g. pool exhausted).
                let s = String::from_utf8_lossy(&o.stdout);
                assert!(
                    o.status.success() || s.contains("\"code\":102"),
                    "seed {seed}: {s}"
                );
            }
        }
    }
    eprintln!("{kills} kills, {completed} calls completed, {rounds} rounds");

    // The store opens cleanly: a fresh ADD works and the file is valid.
    let fresh = Att::new("after-crashes");
    assert_eq!(net.add(&fresh).addresses().len(), 2, "seed {seed}");
    let leased = net.leased(); // panics on two leased records for one address
    let mut per_att: BTreeMap<(String, String), Vec<std::net::IpAddr>> = BTreeMap::new();
    for (ip, att) in &leased {
        per_att.entry(att.clone()).or_default().push(*ip);
    }
    for (att, ips) in &per_att {
        assert!(
            ips.len() <= 2 && ips.iter().filter(|i| i.is_ipv4()).count() <= 1,
            "seed {seed}: {att:?} holds {ips:?}"
        );
    }
    // Every container DEL releases everything.
    for a in pool.iter().chain([&fresh]) {
        net.del(a).expect_ok();
    }
    assert!(
        net.leased().is_empty(),
        "seed {seed}: still leased after DEL of everything: {:?}",
        net.leased()
    );
    // And the whole range is allocatable again.
    let (got, _) = net.exhaust("refill");
    assert_eq!(
        got.iter().filter(|i| i.is_ipv4()).count(),
        62,
        "seed {seed}"
    );
}
