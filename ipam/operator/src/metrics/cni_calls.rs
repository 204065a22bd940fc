//! The node's CNI calls, as the plugins left them in the call spool
//! ([`tether_cni::call_spool`]): a duration histogram and an error counter by plugin, verb and
//! network (and CNI code). The agent takes the records in every few seconds and keeps the sums
//! in a file beside them (`tally.json`, under a lock), so the counts go on across agent restarts
//! and rollouts: a call made while no agent ran is counted by the next one, and none is counted
//! twice when two agents overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tether_cni::call_spool::{CallRecord, Spool};
use tether_trusted_fs::Open;

use super::labels;

/// Upper bounds of the duration buckets, in seconds: an ADD is tens of milliseconds on a warm
/// node, seconds when it waits for the API or a probe, and bounded by the runtime's timeout.
pub const BOUNDS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Networks counted by name; past this many, calls count under [`OTHER_NETWORK`]. Anyone who
/// may write a NAD names networks, and each name is a series on every node.
pub const MAX_NETWORKS: usize = 256;
pub const OTHER_NETWORK: &str = "(other)";

const PLUGINS: &[&str] = &["tether-ipvlan", "tether-ipam"];
const VERBS: &[&str] = &["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "unknown"];

/// Records taken per round: a spool that grew while no agent ran is worked off in steps.
const TAKE_PER_ROUND: usize = 20_000;

const TALLY: &str = "tally.json";
const TALLY_PART: &str = "tally.json.part";
const TALLY_LOCK: &str = "tally.lock";

/// Calls of one plugin, verb and network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Series {
    plugin: String,
    verb: String,
    network: String,
    /// Per bucket of [`BOUNDS`], plus one past the last bound (not cumulative).
    buckets: Vec<u64>,
    sum: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Errors {
    plugin: String,
    verb: String,
    network: String,
    code: u32,
    count: u64,
}

/// The sums, as kept in `tally.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Tally {
    series: Vec<Series>,
    errors: Vec<Errors>,
}

impl Tally {
    fn add(&mut self, r: &CallRecord) -> bool {
        if !PLUGINS.contains(&r.plugin.as_str()) || !r.seconds.is_finite() || r.seconds < 0.0 {
            return false;
        }
        let verb = VERBS
            .iter()
            .find(|v| **v == r.verb)
            .copied()
            .unwrap_or("unknown");
        let network = self.network_label(&r.network);
        let bucket = BOUNDS
            .iter()
            .position(|b| r.seconds <= *b)
            .unwrap_or(BOUNDS.len());
        let at = self
            .series
            .iter()
            .position(|s| s.plugin == r.plugin && s.verb == verb && s.network == network);
        let series = match at {
            Some(i) => &mut self.series[i],
            None => {
                self.series.push(Series {
                    plugin: r.plugin.clone(),
                    verb: verb.to_string(),
                    network: network.clone(),
                    buckets: vec![0; BOUNDS.len() + 1],
                    sum: 0.0,
                });
                self.series.last_mut().expect("just pushed")
            }
        };
        series.buckets[bucket] += 1;
        series.sum += r.seconds;
        if r.code != 0 {
            match self.errors.iter_mut().find(|e| {
                e.plugin == r.plugin && e.verb == verb && e.network == network && e.code == r.code
            }) {
                Some(e) => e.count += 1,
                None => self.errors.push(Errors {
                    plugin: r.plugin.clone(),
                    verb: verb.to_string(),
                    network,
                    code: r.code,
                    count: 1,
                }),
            }
        }
        true
    }

    /// The network's label: its name while fewer than [`MAX_NETWORKS`] are counted.
    fn network_label(&self, name: &str) -> String {
        if self.series.iter().any(|s| s.network == name) {
            return name.to_string();
        }
        // A name not counted yet: is there room for it?
        let known: BTreeSet<&str> = self.series.iter().map(|s| s.network.as_str()).collect();
        if known.len() < MAX_NETWORKS && name.len() <= 253 {
            name.to_string()
        } else {
            OTHER_NETWORK.to_string()
        }
    }

    /// A tally whose buckets are not today's (another version wrote it) starts again.
    fn fits(&self) -> bool {
        self.series
            .iter()
            .all(|s| s.buckets.len() == BOUNDS.len() + 1)
    }
}

/// What one round took in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Absorbed {
    pub counted: usize,
    /// Files in the spool that were not a record of a tether plugin (removed uncounted).
    pub refused: usize,
}

/// The node's CNI calls: the spool, and the sums last read or written.
#[derive(Clone)]
pub struct CniCalls(Arc<Inner>);

struct Inner {
    spool: Spool,
    shown: Mutex<Tally>,
}

impl std::fmt::Debug for CniCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CniCalls({})", self.0.spool.dir().path().display())
    }
}

impl CniCalls {
    /// Over the spool at `path`, created (root only) when missing.
    pub fn open(path: &std::path::Path) -> Result<CniCalls, String> {
        let spool = Spool::open(path, true).map_err(|e| e.to_string())?;
        Ok(CniCalls(Arc::new(Inner {
            spool,
            shown: Mutex::new(Tally::default()),
        })))
    }

    /// Take in the records the plugins left: add them to the kept sums, then remove them.
    pub fn absorb(&self) -> Result<Absorbed, String> {
        let dir = self.0.spool.dir();
        let lock = dir
            .open_file(TALLY_LOCK, Open::Lock)
            .map_err(|e| e.to_string())?;
        lock.lock()
            .map_err(|e| format!("locking {}: {e}", dir.join(TALLY_LOCK).display()))?;
        let mut tally = self.read_kept()?;
        let taken = self
            .0
            .spool
            .take(TAKE_PER_ROUND)
            .map_err(|e| e.to_string())?;
        let mut absorbed = Absorbed {
            refused: taken.unreadable,
            ..Absorbed::default()
        };
        for r in &taken.records {
            if tally.add(r) {
                absorbed.counted += 1;
            } else {
                absorbed.refused += 1;
            }
        }
        if !taken.names.is_empty() {
            // Kept first, then removed: a crash between the two counts those records again,
            // never loses them.
            self.keep(&tally)?;
            self.0
                .spool
                .forget(&taken.names)
                .map_err(|e| e.to_string())?;
        }
        *self.0.shown.lock().unwrap_or_else(|p| p.into_inner()) = tally;
        drop(lock);
        Ok(absorbed)
    }

    fn read_kept(&self) -> Result<Tally, String> {
        let dir = self.0.spool.dir();
        let Some(mut file) = dir.read_file(TALLY).map_err(|e| e.to_string())? else {
            return Ok(Tally::default());
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| format!("reading {}: {e}", dir.join(TALLY).display()))?;
        match serde_json::from_str::<Tally>(&text) {
            Ok(t) if t.fits() => Ok(t),
            // Unreadable or of other buckets: counting starts again (a counter reset to
            // Prometheus) rather than stopping for good.
            _ => {
                log::error!(
                    "{} is not a tally of this version: CNI call counts start again",
                    dir.join(TALLY).display()
                );
                Ok(Tally::default())
            }
        }
    }

    fn keep(&self, tally: &Tally) -> Result<(), String> {
        let dir = self.0.spool.dir();
        let text = serde_json::to_vec(tally).expect("a tally serializes");
        let mut part = dir
            .open_file(TALLY_PART, Open::Replace)
            .map_err(|e| e.to_string())?;
        part.write_all(&text)
            .map_err(|e| format!("writing {}: {e}", dir.join(TALLY_PART).display()))?;
        dir.rename(TALLY_PART, TALLY).map_err(|e| e.to_string())
    }

    /// The two families in the text exposition format.
    pub fn render(&self) -> String {
        let t = self.0.shown.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let name = "tether_cni_call_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} CNI calls of the plugins on this node by plugin, verb and network: time from the plugin's start to its reply.\n# TYPE {name} histogram"
        );
        let mut series: Vec<&Series> = t.series.iter().collect();
        series.sort_by(|a, b| {
            (&a.plugin, &a.verb, &a.network).cmp(&(&b.plugin, &b.verb, &b.network))
        });
        for s in series {
            let base = [
                ("plugin", s.plugin.as_str()),
                ("verb", s.verb.as_str()),
                ("network", s.network.as_str()),
            ];
            let mut cumulative = 0;
            for (i, n) in s.buckets.iter().enumerate() {
                cumulative += n;
                let le = BOUNDS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
                let mut l = base.to_vec();
                l.push(("le", &le));
                let _ = writeln!(out, "{name}_bucket{} {cumulative}", labels(&l));
            }
            let _ = writeln!(out, "{name}_sum{} {}", labels(&base), s.sum);
            let _ = writeln!(out, "{name}_count{} {cumulative}", labels(&base));
        }
        let name = "tether_cni_call_errors_total";
        let _ = writeln!(
            out,
            "# HELP {name} CNI calls of the plugins on this node that failed, by plugin, verb, network and CNI error code.\n# TYPE {name} counter"
        );
        let mut errors: BTreeMap<(&str, &str, &str, u32), u64> = BTreeMap::new();
        for e in &t.errors {
            errors.insert((&e.plugin, &e.verb, &e.network, e.code), e.count);
        }
        for ((plugin, verb, network, code), n) in errors {
            let code = code.to_string();
            let l = [
                ("plugin", plugin),
                ("verb", verb),
                ("network", network),
                ("code", code.as_str()),
            ];
            let _ = writeln!(out, "{name}{} {n}", labels(&l));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tether-cni-calls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn call(plugin: &str, verb: &str, network: &str, code: u32, seconds: f64) -> CallRecord {
        CallRecord {
            plugin: plugin.into(),
            verb: verb.into(),
            network: network.into(),
            code,
            seconds,
        }
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn calls_left_while_no_agent_ran_are_counted_and_survive_its_restart() {
        let root = scratch("restart");
        let path = root.join("calls");
        // The first agent creates the spool; then it is away while the plugins run.
        drop(CniCalls::open(&path).unwrap());
        let spool = Spool::existing(&path).unwrap().expect("the agent made it");
        spool
            .write(&call("tether-ipvlan", "ADD", "mgmt", 0, 0.02))
            .unwrap();
        spool
            .write(&call("tether-ipvlan", "ADD", "mgmt", 11, 3.0))
            .unwrap();
        spool
            .write(&call("tether-ipam", "DEL", "mgmt", 0, 0.004))
            .unwrap();
        let agent = CniCalls::open(&path).unwrap();
        assert_eq!(
            agent.absorb().unwrap(),
            Absorbed {
                counted: 3,
                refused: 0
            }
        );
        let m = agent.render();
        let add = r#"{plugin="tether-ipvlan",verb="ADD",network="mgmt""#;
        assert_eq!(
            sample(
                &m,
                &format!("tether_cni_call_duration_seconds_count{add}}}")
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &m,
                &format!(r#"tether_cni_call_duration_seconds_bucket{add},le="0.025"}}"#)
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &m,
                &format!(r#"tether_cni_call_duration_seconds_bucket{add},le="5"}}"#)
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &m,
                &format!(r#"tether_cni_call_duration_seconds_bucket{add},le="+Inf"}}"#)
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&m, &format!("tether_cni_call_duration_seconds_sum{add}}}")),
            Some(3.02)
        );
        assert_eq!(
            sample(
                &m,
                &format!(r#"tether_cni_call_errors_total{add},code="11"}}"#)
            ),
            Some(1.0)
        );
        assert!(
            !m.contains(r#"verb="DEL",network="mgmt",code"#),
            "a DEL that succeeded is no error"
        );
        drop(agent);
        // The records are gone; the next agent starts from the kept sums and adds to them.
        spool
            .write(&call("tether-ipvlan", "ADD", "mgmt", 0, 0.02))
            .unwrap();
        let next = CniCalls::open(&path).unwrap();
        assert_eq!(next.absorb().unwrap().counted, 1);
        assert_eq!(
            sample(
                &next.render(),
                &format!("tether_cni_call_duration_seconds_count{add}}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            next.absorb().unwrap().counted,
            0,
            "nothing is counted twice"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn two_agents_on_one_spool_count_each_call_once() {
        let root = scratch("overlap");
        let path = root.join("calls");
        let (a, b) = (
            CniCalls::open(&path).unwrap(),
            CniCalls::open(&path).unwrap(),
        );
        let spool = Spool::existing(&path).unwrap().unwrap();
        for i in 0..40 {
            spool
                .write(&call("tether-ipam", "ADD", "compute", 0, 0.01))
                .unwrap();
            if i % 3 == 0 {
                a.absorb().unwrap();
            } else if i % 3 == 1 {
                b.absorb().unwrap();
            }
        }
        a.absorb().unwrap();
        b.absorb().unwrap();
        let count = r#"tether_cni_call_duration_seconds_count{plugin="tether-ipam",verb="ADD",network="compute"}"#;
        assert_eq!(sample(&a.render(), count), Some(40.0));
        assert_eq!(sample(&b.render(), count), Some(40.0));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn what_a_record_may_not_name_is_bounded() {
        let mut t = Tally::default();
        assert!(
            !t.add(&call("sh", "ADD", "n", 0, 0.1)),
            "not a tether plugin"
        );
        assert!(!t.add(&call("tether-ipam", "ADD", "n", 0, f64::NAN)));
        assert!(t.add(&call("tether-ipam", "EXPLODE", "n", 4, 0.1)));
        assert_eq!(t.series[0].verb, "unknown");
        for i in 0..MAX_NETWORKS + 10 {
            t.add(&call("tether-ipam", "ADD", &format!("net-{i}"), 0, 0.1));
        }
        let networks: BTreeSet<&str> = t.series.iter().map(|s| s.network.as_str()).collect();
        assert_eq!(networks.len(), MAX_NETWORKS + 1);
        assert!(networks.contains(OTHER_NETWORK));
        // A network counted already keeps its own series.
        t.add(&call("tether-ipam", "DEL", "n", 0, 0.1));
        assert!(t.series.iter().any(|s| s.network == "n" && s.verb == "DEL"));
    }

    #[test]
    fn a_tally_of_other_buckets_starts_again() {
        let root = scratch("buckets");
        let path = root.join("calls");
        let agent = CniCalls::open(&path).unwrap();
        std::fs::write(
            path.join(TALLY),
            r#"{"series":[{"plugin":"tether-ipam","verb":"ADD","network":"n","buckets":[1,2],"sum":1.0}],"errors":[]}"#,
        )
        .unwrap();
        Spool::existing(&path)
            .unwrap()
            .unwrap()
            .write(&call("tether-ipam", "ADD", "n", 0, 0.1))
            .unwrap();
        agent.absorb().unwrap();
        let count = r#"tether_cni_call_duration_seconds_count{plugin="tether-ipam",verb="ADD",network="n"}"#;
        assert_eq!(sample(&agent.render(), count), Some(1.0));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
