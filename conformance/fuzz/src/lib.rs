//! The property each fuzz target checks, as plain functions: the libFuzzer targets call them, and
//! `tests/regressions.rs` replays every saved crash input through them on stable Rust.

use tether_cni::{CniResult, Version};
use tether_leases::{FileStore, LeaseStore, Scope};

/// The network-config parser and both plugins' views of it: any bytes give a config or an error.
pub fn netconf(data: &[u8]) {
    if let Ok(conf) = tether_cni::NetConf::parse(data) {
        let _ = tether_attach::IpvlanConfig::from_conf(&conf);
        let _ = tether_attach::IpvlanConfig::chained_master(conf.prev_result.as_ref());
        for agent in [
            tether_pool::NodeAgent::Absent,
            tether_pool::NodeAgent::on_every_node(),
        ] {
            let _ = tether_pool::PoolConfig::from_slice(&conf.raw, &agent);
        }
        let _ = conf.runtime_config("ips");
        let _ = conf.args_cni("ips");
    }
}

/// CNI_ARGS and the env validators: never panic; every parsed pair has a key.
pub fn cni_args(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(args) = tether_cni::env::CniArgs::parse(s) {
        for (k, _) in args.pairs() {
            assert!(!k.is_empty());
        }
        let _ = args.get("IP");
    }
    let _ = tether_cni::env::validate_ifname(s);
    let _ = tether_cni::env::validate_container_id(s);
}

/// Ranges: whatever parses hands out only addresses it contains, from any start offset.
/// Input: `<range text>[@<offset seed>]`.
pub fn range(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (text, offset) = s.split_once('@').map_or((s, 0u128), |(t, o)| {
        (
            t,
            o.bytes()
                .fold(0u128, |a, b| a.wrapping_mul(31).wrapping_add(b.into())),
        )
    });
    if let Ok(r) = tether_pool::IpRange::parse(text) {
        for ip in r.candidates(offset).take(64) {
            assert!(r.contains(ip), "{r} handed out {ip}");
        }
    }
    let _ = tether_pool::RequestedIp::parse(s);
}

/// Result conversion: anything that reads as a Result survives every layout.
pub fn result(data: &[u8]) {
    let Ok(r) = CniResult::from_slice(data) else {
        return;
    };
    for v in [
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ] {
        let back = CniResult::from_value(&r.to_value(v)).expect("our own output reads back");
        assert_eq!(back.ips, r.ips, "{v}");
        assert_eq!(back.routes, r.routes, "{v}");
        if !v.is_legacy_layout() {
            assert_eq!(back, r, "1.x layouts are lossless");
        }
    }
}

/// The file store's on-disk formats: any bytes in a network's state file from before uniqueness
/// domains give leases (moved into the domain's file) or a clear error, and a file the store
/// accepted stays readable after the store rewrote it.
pub fn store_file(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("tether-fuzz-store-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let store = FileStore::new(&dir);
    let scope = Scope::cluster("fuzz");
    // Each input on its own: nothing of the previous one's domain file.
    let _ = std::fs::remove_file(store.state_path(None));
    std::fs::write(store.network_state_path(&scope.network), data).expect("temp dir is writable");
    if let Ok(leases) = store.list(&scope)
        && let Some(first) = leases.first()
    {
        let _ = store.remove(first);
        store
            .list(&scope)
            .expect("a file the store wrote itself reads back");
    }
    // The same bytes as a domain's own state file.
    let _ = std::fs::remove_file(store.network_state_path(&scope.network));
    std::fs::write(store.state_path(None), data).expect("temp dir is writable");
    if let Ok(leases) = store.list(&scope)
        && let Some(first) = leases.first()
    {
        let _ = store.remove(first);
        store
            .list(&scope)
            .expect("a file the store wrote itself reads back");
    }
}
