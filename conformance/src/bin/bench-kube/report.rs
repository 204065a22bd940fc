//! The markdown tables and the targets' PASS/MISS lines.

use std::collections::BTreeMap;

use crate::ceiling::CeilingRow;
use crate::phases::{Kind, Plugin};
use crate::server::Counts;
use crate::{ApiRow, Opts, Row, ScaleRow};

// ----- formatting -------------------------------------------------------------------------------

fn f_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn f_ratio(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 10.0 {
        format!("{v:.0}×")
    } else {
        format!("{v:.2}×")
    }
}

/// Per call, by resource: `ippools GET 1, PATCH 1; leases GET 2, PUT 3`.
fn breakdown(d: &Counts, calls: usize) -> String {
    let mut by_resource: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((r, verb), n) in d {
        let x = n / calls as f64;
        let x = if (x - x.round()).abs() < 0.005 {
            format!("{x:.0}")
        } else {
            format!("{x:.2}")
        };
        by_resource
            .entry(r)
            .or_default()
            .push(format!("{verb} {x}"));
    }
    let parts: Vec<String> = by_resource
        .into_iter()
        .map(|(r, verbs)| format!("{r} {}", verbs.join(", ")))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

/// Every table, then the targets of issue 25.
pub fn report(
    o: &Opts,
    plugins: &[Plugin; 3],
    rows: &[Row],
    ceiling: &[CeilingRow],
    fallback: Option<&Row>,
    api: &[ApiRow],
    scale: &[ScaleRow],
) {
    allocations(plugins, rows, fallback);
    cpu(plugins, rows, fallback);
    ratios(o, plugins, rows);
    ceiling_rows(plugins, rows, ceiling);
    requests(o, plugins, api);
    scale_rows(o, scale);
    targets(o, plugins, rows, fallback, api, scale);
}

fn row_label(p: &Plugin, fallback: bool) -> String {
    if fallback {
        format!("{}, agent stopped halfway", p.name)
    } else {
        p.name.to_string()
    }
}

fn allocations(plugins: &[Plugin; 3], rows: &[Row], fallback: Option<&Row>) {
    println!();
    println!("### Allocations: N ADDs, one process each, then a DEL of each");
    println!();
    println!(
        "allocs/s: successful ADDs over the ADD phase's wall time. dup: successful ADDs whose address another ADD \
         of the row also got. leased after DEL: what the store still holds (tether: IPLeases in state Leased; \
         whereabouts: allocations in its IPPool). The last row is tether-ipam through the agent with the agent \
         stopped (SIGTERM) as half its ADDs had started: the rest, and the DELs, went straight to the API server."
    );
    println!();
    println!(
        "| plugin | conc | ADDs | failed | dup | allocs/s | ADD p50 ms | ADD p99 ms | DEL p50 ms | DEL p99 ms | DEL failed | leased after DEL |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let all = rows
        .iter()
        .map(|r| (r, false))
        .chain(fallback.map(|f| (f, true)));
    for (r, fb) in all {
        println!(
            "| {} | {} | {}{} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            row_label(&plugins[r.plugin], fb),
            r.concurrency,
            r.add.calls.len(),
            if r.add.capped() {
                format!(" of {} (cap)", r.add.planned)
            } else {
                String::new()
            },
            r.add.failed(),
            r.add.duplicates(),
            r.add.rate(),
            f_ms(r.add.q_ms(0.5)),
            f_ms(r.add.q_ms(0.99)),
            f_ms(r.del.q_ms(0.5)),
            f_ms(r.del.q_ms(0.99)),
            r.del.failed(),
            r.left
        );
    }
}

fn cpu(plugins: &[Plugin; 3], rows: &[Row], fallback: Option<&Row>) {
    println!();
    println!("### CPU per ADD (ms): what one allocation costs the machine");
    println!();
    println!(
        "CPU time (user + system) over each ADD phase, per successful ADD: the plugin processes (this \
         benchmark's reaped children), the node-agent's lease service, kube-apiserver and etcd \
         (`/proc/<pid>/stat`). The API server's column is what the cluster pays."
    );
    println!();
    println!("| plugin | conc | plugin processes | lease service | API server | etcd | total |");
    println!("|---|--:|--:|--:|--:|--:|--:|");
    let all = rows
        .iter()
        .map(|r| (r, false))
        .chain(fallback.map(|f| (f, true)));
    for (r, fb) in all {
        let c = r.add.cpu_ms();
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            row_label(&plugins[r.plugin], fb),
            r.concurrency,
            c[0],
            c[1],
            c[2],
            c[3],
            c[4]
        );
    }
}

fn row(rows: &[Row], pi: usize, c: usize) -> Option<&Row> {
    rows.iter().find(|r| r.plugin == pi && r.concurrency == c)
}

fn ratios(o: &Opts, plugins: &[Plugin; 3], rows: &[Row]) {
    let wb = plugins.iter().position(|p| p.kind == Kind::Whereabouts);
    for (ti, t) in plugins.iter().enumerate().filter(|(_, p)| p.is_tether()) {
        println!();
        println!("### {} / whereabouts, same server, same run", t.name);
        println!();
        println!(
            "| conc | allocs/s (higher is better) | ADD p50 | ADD p99 | DEL p50 | DEL p99 | CPU per ADD |"
        );
        println!("|--:|--:|--:|--:|--:|--:|--:|");
        for &c in &o.concurrency {
            let (Some(t), Some(w)) = (row(rows, ti, c), wb.and_then(|w| row(rows, w, c))) else {
                continue;
            };
            let q = |f: &dyn Fn(&Row) -> f64| f_ratio(f(t) / f(w));
            println!(
                "| {c} | {} | {} | {} | {} | {} | {} |",
                q(&|r| r.add.rate()),
                q(&|r| r.add.q_ms(0.5)),
                q(&|r| r.add.q_ms(0.99)),
                q(&|r| r.del.q_ms(0.5)),
                q(&|r| r.del.q_ms(0.99)),
                q(&|r| r.add.cpu_ms()[4]),
            );
        }
    }
}

fn ceiling_rows(plugins: &[Plugin; 3], rows: &[Row], ceiling: &[CeilingRow]) {
    if ceiling.is_empty() {
        return;
    }
    let idx = |k: Kind| plugins.iter().position(|p| p.kind == k);
    let (agent, direct) = (idx(Kind::Agent), idx(Kind::Direct));
    println!();
    println!("### The ceiling of one object per address: IPLease CREATEs/s on the same server");
    println!();
    println!(
        "tether-ipam through the agent makes one API request per ADD, the CREATE of the address's IPLease, so \
         the server's CREATE rate of such objects bounds its allocations/s. Measured right after the rows above, \
         same server, same run: CREATEs of IPLeases like the ones tether-ipam writes (named by address, state \
         Leased, spec.node and the network, node and pod labels as the store sets them), with the IPLease CRD's \
         schema and the node-scope ValidatingAdmissionPolicy in force (the clients hold the plugins' node-bound \
         token, so the policy evaluates every CREATE as it does tether's), from as many workers as the row's \
         concurrency, each a client of its own keeping its one HTTP/1.1 connection open, warmed up by one \
         unmeasured CREATE. What the ceiling leaves out is what an ADD is: a process exec'd per call, its \
         config parsed, the lease service's round trip and bookkeeping. creates/s: successful CREATEs over the \
         wall time from the start barrier to the last answer; the objects are deleted afterwards."
    );
    println!();
    println!(
        "| conc | CREATEs | failed | creates/s (ceiling) | CREATE p50 ms | CREATE p99 ms | API server + etcd CPU per CREATE ms | tether-ipam (agent) allocs/s | agent / ceiling | tether-ipam (direct) allocs/s | direct / ceiling |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let frac = |pi: Option<usize>, c: &CeilingRow| -> (String, String) {
        match pi.and_then(|pi| row(rows, pi, c.concurrency)) {
            Some(r) => (
                format!("{:.1}", r.add.rate()),
                format!("{:.0}%", 100.0 * r.add.rate() / c.rate()),
            ),
            None => ("-".into(), "-".into()),
        }
    };
    for c in ceiling {
        let (a, af) = frac(agent, c);
        let (d, df) = frac(direct, c);
        println!(
            "| {} | {} | {} | {:.1} | {} | {} | {:.2} | {a} | {af} | {d} | {df} |",
            c.concurrency,
            c.ok() + c.failed,
            c.failed,
            c.rate(),
            f_ms(c.q_ms(0.5)),
            f_ms(c.q_ms(0.99)),
            c.server_cpu_ms(),
        );
    }
    let fractions: Vec<String> = ceiling
        .iter()
        .filter_map(|c| {
            let r = row(rows, agent?, c.concurrency)?;
            Some(format!(
                "{:.0}% at {}-way",
                100.0 * r.add.rate() / c.rate(),
                c.concurrency
            ))
        })
        .collect();
    if !fractions.is_empty() {
        println!();
        println!(
            "tether-ipam (agent) allocations/s as a fraction of the ceiling: {}.",
            fractions.join(", ")
        );
    }
}

fn requests(o: &Opts, plugins: &[Plugin; 3], api: &[ApiRow]) {
    if api.is_empty() {
        return;
    }
    println!();
    println!(
        "### API requests per call: the node's first ADD in the network, {} more ADDs, then {} DELs, at concurrency 1 (server's apiserver_request_total)",
        o.api_calls - 1,
        o.api_calls
    );
    println!();
    println!(
        "| plugin | first ADD | per ADD | per DEL | first ADD: resource verb | ADD: resource verb per call | DEL: resource verb per call |"
    );
    println!("|---|--:|--:|--:|---|---|---|");
    for a in api {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            plugins[a.plugin].name,
            a.per_first(),
            a.per_add(),
            a.per_del(),
            breakdown(&a.first, 1),
            breakdown(&a.add, a.adds.max(1)),
            breakdown(&a.del, a.dels.max(1))
        );
    }
}

fn scale_rows(o: &Opts, scale: &[ScaleRow]) {
    if scale.is_empty() {
        return;
    }
    println!();
    println!(
        "### Scale: tether-ipam (agent), {} ADDs at concurrency 1 with IPLeases already in the cluster",
        o.scale_n
    );
    println!();
    println!(
        "Created through the API before the row, state Leased: {} in the measured network on addresses of its \
         range spread over it (the ADDs must skip those they meet), {} in another network. dup or taken: ADDs \
         handed an address another ADD or a pre-existing lease holds. requests per ADD: the server's count on \
         ipleases.",
        o.scale_leases / 2,
        o.scale_leases - o.scale_leases / 2
    );
    println!();
    println!(
        "| IPLeases | ADDs | failed | dup or taken | ADD p50 ms | ADD p99 ms | requests per ADD | API server CPU per ADD ms | DEL p50 ms | DEL p99 ms | DEL failed |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in scale {
        println!(
            "| {} | {}{} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} |",
            s.existing,
            s.add.calls.len(),
            if s.add.capped() {
                format!(" of {} (cap)", s.add.planned)
            } else {
                String::new()
            },
            s.add.failed(),
            s.collisions,
            f_ms(s.add.q_ms(0.5)),
            f_ms(s.add.q_ms(0.99)),
            s.requests_per_add,
            s.add.cpu_ms()[2],
            f_ms(s.del.q_ms(0.5)),
            f_ms(s.del.q_ms(0.99)),
            s.del.failed(),
        );
    }
}

fn targets(
    o: &Opts,
    plugins: &[Plugin; 3],
    rows: &[Row],
    fallback: Option<&Row>,
    api: &[ApiRow],
    scale: &[ScaleRow],
) {
    println!();
    println!("### Targets (issue 25)");
    println!();
    let cmax = o.concurrency.iter().copied().max().unwrap_or(1);
    let idx = |k: Kind| plugins.iter().position(|p| p.kind == k).unwrap_or(0);
    let (agent, wb) = (idx(Kind::Agent), idx(Kind::Whereabouts));
    let ours: Vec<(&Row, &str)> = rows
        .iter()
        .filter(|r| r.plugin == agent)
        .map(|r| (r, ""))
        .chain(fallback.map(|f| (f, " (agent stopped halfway)")))
        .collect();
    for (r, what) in &ours {
        let c = r.add.cpu_ms()[4];
        println!(
            "- {}: CPU per ADD (plugin + lease service + API server + etcd) ≤ 5 ms at {}-way{what}: {c:.2} ms",
            pass(c <= 5.0),
            r.concurrency
        );
    }
    let at_max: Vec<&(&Row, &str)> = ours.iter().filter(|(r, _)| r.concurrency == cmax).collect();
    match row(rows, wb, cmax) {
        Some(w) => {
            for (t, what) in &at_max {
                let x = t.add.rate() / w.add.rate();
                println!(
                    "- {}: allocations/s at {cmax}-way ≥ 40× whereabouts{what}: {}",
                    pass(x >= 40.0),
                    f_ratio(x)
                );
            }
        }
        None => println!("- MISS: allocations/s ≥ 40× whereabouts: not measured"),
    }
    for (t, what) in &at_max {
        let p99 = t.add.q_ms(0.99);
        println!(
            "- {}: ADD p99 ≤ 250 ms at {cmax}-way{what}: {} ms",
            pass(p99 <= 250.0),
            f_ms(p99)
        );
    }
    match fallback {
        Some(f) => println!(
            "- {}: 0 failed ADDs with the agent stopped halfway: {} failed (and {} failed DELs)",
            pass(f.add.failed() == 0 && f.add.ok() > 0),
            f.add.failed(),
            f.del.failed()
        ),
        None => println!("- MISS: the fallback row: not measured"),
    }
    for a in api.iter().filter(|a| plugins[a.plugin].is_tether()) {
        let name = plugins[a.plugin].name;
        println!(
            "- {}: {name}: ≤ 2 API requests per ADD, the node's first in the network included: first {:.0}, then {:.2}",
            pass(a.per_first() <= 2.0 && a.per_add() <= 2.0),
            a.per_first(),
            a.per_add()
        );
    }
    let t_rows: Vec<&Row> = rows
        .iter()
        .filter(|r| plugins[r.plugin].is_tether())
        .chain(fallback)
        .collect();
    let dups: usize = t_rows.iter().map(|r| r.add.duplicates()).sum::<usize>()
        + scale.iter().map(|s| s.collisions).sum::<usize>();
    let fails: usize = t_rows.iter().map(|r| r.add.failed() + r.del.failed()).sum();
    println!(
        "- {}: tether-ipam duplicate addresses: {dups} (failed calls: {fails})",
        pass(dups == 0 && !t_rows.is_empty())
    );
}
