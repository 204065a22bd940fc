use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::json;
use tether_pool::{
    ConfigError, KubeconfigSource, NODE_KUBECONFIG, NodeAgent, PoolConfig, ProbeConfig, StoreKind,
    StoreSource,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Parsed as on a host without tether's node-agent.
fn parse(ipam: serde_json::Value) -> Result<PoolConfig, ConfigError> {
    PoolConfig::from_value(
        &json!({"cniVersion": "1.0.0", "name": "net1", "type": "tether-ipvlan", "ipam": ipam}),
        &NodeAgent::Absent,
    )
}

fn err(ipam: serde_json::Value) -> String {
    parse(ipam).unwrap_err().to_string()
}

#[test]
fn whereabouts_nad_unchanged() {
    let nad = br#"{
      "cniVersion": "0.3.1",
      "name": "whereaboutsexample",
      "type": "macvlan",
      "master": "eth0",
      "mode": "bridge",
      "ipam": {
        "type": "whereabouts",
        "range": "192.168.2.225/28",
        "exclude": ["192.168.2.229/30", "192.168.2.236/32"],
        "gateway": "192.168.2.238",
        "routes": [{"dst": "0.0.0.0/0", "gw": "192.168.2.238"}, {"dst": "10.0.0.0/8"}],
        "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["a.example.com"], "options": ["ndots:2"]},
        "log_file": "/tmp/whereabouts.log",
        "log_level": "debug",
        "enable_overlapping_ranges": true,
        "leader_lease_duration": 1500,
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig", "k8s_api_root": "https://x"}
      }
    }"#;
    let c = PoolConfig::from_slice(nad, &NodeAgent::on_every_node()).unwrap();
    assert_eq!(c.network_name, "whereaboutsexample");
    assert_eq!(c.ranges.len(), 1);
    let r = &c.ranges[0];
    assert_eq!(r.to_string(), "192.168.2.224/28");
    assert_eq!(r.gateway(), Some(ip("192.168.2.238")));
    let usable: Vec<String> = r.candidates(0).map(|a| a.to_string()).collect();
    // .224 network, .228-.231 excluded, .236 excluded, .238 gateway, .239 broadcast
    assert_eq!(
        usable,
        [
            "192.168.2.225",
            "192.168.2.226",
            "192.168.2.227",
            "192.168.2.232",
            "192.168.2.233",
            "192.168.2.234",
            "192.168.2.235",
            "192.168.2.237"
        ]
    );
    assert_eq!(c.gateway, Some(ip("192.168.2.238")));
    assert_eq!(c.gateway_for(0), Some(ip("192.168.2.238")));
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[0].gw, Some(ip("192.168.2.238")));
    assert_eq!(c.routes[1].dst.to_string(), "10.0.0.0/8");
    assert_eq!(c.routes[1].gw, None);
    assert_eq!(c.dns.nameservers, ["8.8.8.8"]);
    assert_eq!(c.dns.domain.as_deref(), Some("example.com"));
    assert_eq!(c.dns.options, ["ndots:2"]);
    // kubeconfig set, store absent → kubernetes, with tether's kubeconfig instead of whereabouts'
    assert_eq!(c.store, StoreKind::Kubernetes);
    assert_eq!(c.store_source, StoreSource::KubeconfigKey);
    let k = c.kubernetes.as_ref().unwrap();
    assert_eq!(k.kubeconfig, Some(PathBuf::from(NODE_KUBECONFIG)));
    assert_eq!(
        k.source,
        KubeconfigSource::InsteadOfWhereabouts(PathBuf::from(
            "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"
        ))
    );
    assert_eq!(k.extra["k8s_api_root"], "https://x");
    // Without the node-agent, whereabouts' kubeconfig is refused.
    let e = PoolConfig::from_slice(nad, &NodeAgent::Absent).unwrap_err();
    assert!(
        e.to_string().starts_with("ipam.kubernetes.kubeconfig "),
        "{e}"
    );
    // defaults
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/tether"));
    assert_eq!(c.cooldown_s, 60);
    assert_eq!(c.quarantine_s, 600);
    assert_eq!(
        c.probe,
        ProbeConfig::Enabled {
            timeout_ms: 100,
            attempts: 1
        }
    );
}

#[test]
fn range_start_end_and_first_last() {
    let c = parse(
        json!({"range": "10.0.0.0/24", "range_start": "10.0.0.10", "range_end": "10.0.0.19"}),
    )
    .unwrap();
    assert_eq!(c.ranges[0].usable_count(), 10);
    assert_eq!(c.ranges[0].start(), ip("10.0.0.10"));
    let c = parse(json!({"range": "10.20.30.241-10.20.30.250/24"})).unwrap();
    assert_eq!(c.ranges[0].usable_count(), 10);
    assert_eq!(c.ranges[0].prefix_len(), 24);
    // empty strings are "unset", as in Go
    let c = parse(json!({"range": "10.0.0.0/29", "range_start": "", "gateway": ""})).unwrap();
    assert_eq!(c.ranges[0].usable_count(), 6);
    assert_eq!(c.gateway, None);
}

#[test]
fn ip_ranges_with_top_level_range_prepended() {
    let c = parse(json!({
        "range": "10.0.0.0/24",
        "exclude": ["10.0.0.0/28"],
        "gateway": "10.0.0.1",
        "ipRanges": [
            {"range": "fd00:1::/64", "exclude": ["fd00:1::1"]},
            {"range": "fd00:2::10-fd00:2::20/64", "unknown": 1},
            {"range": "10.9.0.0/16", "range_start": "10.9.1.0", "range_end": "10.9.1.255", "exclude": ["10.9.1.0/30"]}
        ],
        "network_name": "gpu-a",
        "store": "file",
        "dataDir": "/run/tether",
        "cooldown_s": 0,
        "quarantine_s": 30,
        "probe": {"timeout_ms": 250, "attempts": 3},
        "kubernetes": {"kubeconfig": "/k"}
    }))
    .unwrap();
    assert_eq!(c.network_name, "gpu-a");
    assert_eq!(c.ranges.len(), 4);
    assert_eq!(c.ranges[0].to_string(), "10.0.0.0/24");
    // top-level exclude applies to the top-level range only; gateway skipped
    assert_eq!(c.ranges[0].candidates(0).next(), Some(ip("10.0.0.16")));
    assert_eq!(c.ranges[0].usable_count(), 254 - 15);
    assert_eq!(c.ranges[1].candidates(0).next(), Some(ip("fd00:1::2")));
    assert_eq!(c.ranges[1].gateway(), None);
    assert_eq!(c.gateway_for(1), None);
    assert_eq!(c.ranges[2].usable_count(), 17);
    assert_eq!(c.ranges[3].usable_count(), 252);
    assert_eq!(c.ranges[3].candidates(0).next(), Some(ip("10.9.1.4")));
    assert_eq!(c.store, StoreKind::File);
    assert_eq!(c.data_dir, PathBuf::from("/run/tether"));
    assert_eq!(c.cooldown_s, 0);
    assert_eq!(c.quarantine_s, 30);
    assert_eq!(
        c.probe,
        ProbeConfig::Enabled {
            timeout_ms: 250,
            attempts: 3
        }
    );
    assert_eq!(
        parse(json!({"range": "10.0.0.0/24", "probe": false}))
            .unwrap()
            .probe,
        ProbeConfig::Disabled
    );
    assert_eq!(
        parse(json!({"range": "10.0.0.0/24", "probe": {}}))
            .unwrap()
            .probe,
        ProbeConfig::default()
    );
}

#[test]
fn defence_is_opt_in() {
    let defend = |v: serde_json::Value| parse(v).map(|c| c.defend);
    assert!(!defend(json!({"range": "10.0.0.0/24"})).unwrap());
    assert!(defend(json!({"range": "10.0.0.0/24", "defend": true})).unwrap());
    assert!(!defend(json!({"range": "10.0.0.0/24", "defend": null})).unwrap());
    let e = defend(json!({"range": "10.0.0.0/24", "defend": "yes"}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ipam.defend") && e.contains("true or false"),
        "{e}"
    );
}

#[test]
fn ipv6_only_and_gateway_per_family() {
    let c = parse(json!({"range": "fd00::/120", "gateway": "fd00::1", "ipRanges": [{"range": "10.0.0.0/30"}]})).unwrap();
    assert_eq!(c.ranges[0].candidates(0).next(), Some(ip("fd00::2")));
    assert_eq!(c.gateway_for(0), Some(ip("fd00::1")));
    assert_eq!(c.gateway_for(1), None);
}

#[test]
fn network_name_defaults_and_missing() {
    assert!(matches!(
        PoolConfig::from_value(
            &json!({"ipam": {"range": "10.0.0.0/24"}}),
            &NodeAgent::Absent
        ),
        Err(ConfigError::NoNetworkName)
    ));
    assert!(matches!(
        PoolConfig::from_value(&json!({"name": "x"}), &NodeAgent::Absent),
        Err(ConfigError::MissingIpam)
    ));
    assert!(matches!(
        parse(json!({"type": "tether-ipam"})),
        Err(ConfigError::NoRanges)
    ));
    assert!(matches!(
        PoolConfig::from_slice(b"{nope", &NodeAgent::Absent),
        Err(ConfigError::Json(_))
    ));
}

#[test]
fn invalid_values_name_key_and_value() {
    assert_eq!(
        err(json!({"range": "10.1.2.9-10.1.2.3/24"})),
        "ipam.range \"10.1.2.9-10.1.2.3/24\": start is after end (10.1.2.9 > 10.1.2.3)"
    );
    let e = err(json!({"range": "10.1.2.0/24", "range_start": "10.1.3.5"}));
    assert!(
        e.starts_with(
            "ipam.range_start \"10.1.3.5\": start 10.1.3.5 is outside the prefix 10.1.2.0/24"
        ),
        "{e}"
    );
    let e =
        err(json!({"range": "10.1.2.0/24", "range_start": "10.1.2.50", "range_end": "10.1.2.40"}));
    assert!(
        e.starts_with("ipam.range_end \"10.1.2.40\": start is after end"),
        "{e}"
    );
    let e = err(json!({"range": "10.1.2.0/24", "range_end": "fd00::1"}));
    assert!(
        e.starts_with("ipam.range_end \"fd00::1\": mixes IPv4 and IPv6"),
        "{e}"
    );
    let e = err(json!({"ipRanges": [{"range": "10.0.0.0/24"}, {"range": "fd00::1-10.0.0.5/24"}]}));
    assert!(
        e.starts_with("ipam.ipRanges[1].range \"fd00::1-10.0.0.5/24\": mixes IPv4 and IPv6"),
        "{e}"
    );
    let e = err(json!({"ipRanges": [{"range": "10.0.0.0/24", "exclude": ["10.0.0.300"]}]}));
    assert!(
        e.starts_with("ipam.ipRanges[0].exclude[0] \"10.0.0.300\": "),
        "{e}"
    );
    let e = err(json!({"range": "10.0.0.0/24", "exclude": "10.0.0.1"}));
    assert!(
        e.starts_with("ipam.exclude \"10.0.0.1\": expected a list"),
        "{e}"
    );
    let e = err(json!({"range": "10.0.0.0/33"}));
    assert!(
        e.starts_with("ipam.range \"10.0.0.0/33\": cannot parse"),
        "{e}"
    );
    let e = err(json!({"range": "10.0.0.0/24", "gateway": "10.0.0.x"}));
    assert_eq!(e, "ipam.gateway \"10.0.0.x\": not an IP address");
    let e = err(json!({"range": "10.0.0.0/24", "cooldown_s": -1}));
    assert_eq!(
        e,
        "ipam.cooldown_s -1: expected a non-negative whole number"
    );
    let e = err(json!({"range": "10.0.0.0/24", "quarantine_s": "600"}));
    assert_eq!(
        e,
        "ipam.quarantine_s \"600\": expected a non-negative whole number"
    );
    let e = err(json!({"range": "10.0.0.0/24", "store": "etcd"}));
    assert_eq!(
        e,
        "ipam.store \"etcd\": expected \"file\" or \"kubernetes\""
    );
    let e = err(json!({"range": "10.0.0.0/24", "dataDir": "relative/dir"}));
    assert_eq!(e, "ipam.dataDir \"relative/dir\": must be an absolute path");
    let e = err(json!({"range": "10.0.0.0/24", "probe": {"attempts": 0}}));
    assert!(e.starts_with("ipam.probe.attempts 0: "), "{e}");
    let e = err(json!({"range": "10.0.0.0/24", "probe": "yes"}));
    assert!(e.starts_with("ipam.probe \"yes\": "), "{e}");
    let e = err(json!({"range": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}));
    assert!(e.starts_with("ipam.routes[0].gw \"fd00::1\": mixes"), "{e}");
    let e = err(json!({"range": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}));
    assert!(e.starts_with("ipam.routes[0] "), "{e}");
    let e = err(json!({"range": 5}));
    assert_eq!(e, "ipam.range 5: expected a string");
}

/// CNI 1.1 route fields are the Result's: parsed into its Route type, and bad values refused by path.
#[test]
fn routes_keep_their_cni_1_1_fields() {
    let c = parse(json!({"range": "10.0.0.0/24", "routes": [
        {"dst": "10.9.0.0/16", "gw": "10.0.0.1", "mtu": 9000, "advmss": 8960, "priority": 10, "table": 100, "scope": 0},
        {"dst": "0.0.0.0/0"}
    ]}))
    .unwrap();
    let r = &c.routes[0];
    assert_eq!(
        (r.mtu, r.adv_mss, r.priority, r.table, r.scope),
        (Some(9000), Some(8960), Some(10), Some(100), Some(0))
    );
    let bare = &c.routes[1];
    assert_eq!((bare.mtu, bare.table, bare.scope), (None, None, None));
    let e = err(json!({"range": "10.0.0.0/24", "routes": [{"dst": "10.9.0.0/16", "table": -1}]}));
    assert!(e.contains("ipam.routes[0].table"), "{e}");
    let e = err(json!({"range": "10.0.0.0/24", "routes": [{"dst": "10.9.0.0/16", "scope": 300}]}));
    assert!(
        e.contains("ipam.routes[0].scope") && e.contains("at most 255"),
        "{e}"
    );
}
