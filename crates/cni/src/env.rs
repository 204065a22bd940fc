//! The `CNI_*` environment: which verb, for which container, in which netns, with which arguments.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::CniError;

/// The verbs of spec 1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

/// `CNI_ARGS` (`K=V;K2=V2`), kept in order. Unknown keys are always accepted: tether reads the keys it
/// knows (`K8S_POD_*`, `IP`, `MAC`) and has no reason to reject the rest, with or without `IgnoreUnknown`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs(Vec<(String, String)>);

impl CniArgs {
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut pairs = Vec::new();
        for item in s.split(';').filter(|p| !p.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(CniError::invalid_env(format!(
                    "CNI_ARGS: {item:?} is not a KEY=VALUE pair (CNI_ARGS is \"K1=V1;K2=V2\")"
                )));
            };
            if k.is_empty() {
                return Err(CniError::invalid_env(format!(
                    "CNI_ARGS: {item:?} has an empty key"
                )));
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        Ok(CniArgs(pairs))
    }

    /// The last value given for `key` (a later pair overrides an earlier one, as kubelet's merge does).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

/// The environment of one invocation, validated for its verb.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: Command,
    /// CNI_CONTAINERID; required for ADD, DEL, CHECK.
    pub container_id: Option<String>,
    /// CNI_NETNS; required for ADD and CHECK, optional (may be empty) for DEL.
    pub netns: Option<PathBuf>,
    /// CNI_IFNAME; required for ADD, DEL, CHECK.
    pub ifname: Option<String>,
    pub args: CniArgs,
    /// CNI_PATH split on `:`; needed only when a plugin is delegated to.
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Read and validate the variables `command` needs from `vars`.
    pub fn from_vars(command: Command, vars: &HashMap<String, String>) -> Result<Env, CniError> {
        // The dispatcher reads the environment with invalid UTF-8 replaced (U+FFFD): a CNI
        // variable so spoilt is refused here, naming it.
        let get = |k: &str| -> Result<Option<String>, CniError> {
            match vars.get(k).filter(|v| !v.is_empty()) {
                Some(v) if v.contains(char::REPLACEMENT_CHARACTER) => Err(CniError::invalid_env(
                    format!("{k} is not valid UTF-8 ({v:?}); the runtime must pass text"),
                )),
                v => Ok(v.cloned()),
            }
        };
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let require = |k: &str| -> Result<String, CniError> {
            get(k)?.ok_or_else(|| {
                CniError::invalid_env(format!("{k} is not set; {} needs it", command.as_str()))
            })
        };

        let (container_id, ifname) = if needs_attachment {
            let id = require("CNI_CONTAINERID")?;
            validate_container_id(&id)?;
            let ifname = require("CNI_IFNAME")?;
            validate_ifname(&ifname)?;
            (Some(id), Some(ifname))
        } else {
            (None, None)
        };
        let netns = match command {
            Command::Add | Command::Check => Some(PathBuf::from(require("CNI_NETNS")?)),
            Command::Del => get("CNI_NETNS")?.map(PathBuf::from),
            _ => None,
        };
        let args = match get("CNI_ARGS")? {
            Some(s) => CniArgs::parse(&s)?,
            None => CniArgs::default(),
        };
        let path = get("CNI_PATH")?
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }

    /// CNI_CONTAINERID, for verbs where `from_vars` guaranteed it.
    pub fn container_id(&self) -> &str {
        self.container_id.as_deref().unwrap_or_default()
    }

    /// CNI_IFNAME, for verbs where `from_vars` guaranteed it.
    pub fn ifname(&self) -> &str {
        self.ifname.as_deref().unwrap_or_default()
    }
}

/// Linux interface names: 1–15 bytes, no `/`, `:` or whitespace, not `.` or `..`.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is not a valid interface name")
    } else if name.contains('/') || name.contains(':') {
        Some("contains '/' or ':'")
    } else if name.chars().any(char::is_whitespace) {
        Some("contains whitespace")
    } else {
        None
    };
    match problem {
        Some(p) => Err(CniError::invalid_env(format!("CNI_IFNAME {name:?} {p}"))),
        None => Ok(()),
    }
}

/// Container IDs: an alphanumeric first, then alphanumerics, `_`, `.`, `-`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if is_spec_identifier(id) {
        Ok(())
    } else {
        Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {id:?} is invalid: it must start with a letter or digit followed by letters, digits, '_', '.' or '-'"
        )))
    }
}

/// The spec's character rule for container IDs and network names.
pub fn is_spec_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn add_names_each_missing_variable() {
        let full = [
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "net1"),
        ];
        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let v: Vec<_> = full
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let e = Env::from_vars(Command::Add, &vars(&v)).unwrap_err();
            assert_eq!(e.code, 4);
            assert!(e.msg.contains(missing), "{}", e.msg);
        }
        let env = Env::from_vars(Command::Add, &vars(&full)).unwrap();
        assert_eq!(env.ifname(), "net1");
    }

    #[test]
    fn a_cni_variable_that_was_not_utf8_is_refused_by_name() {
        for (k, v) in [
            ("CNI_IFNAME", "net\u{FFFD}"),
            ("CNI_CONTAINERID", "c\u{FFFD}1"),
            ("CNI_ARGS", "K8S_POD_NAME=\u{FFFD}"),
            ("CNI_PATH", "/opt/cni/\u{FFFD}"),
        ] {
            let mut all = vars(&[
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", "/run/netns/x"),
                ("CNI_IFNAME", "net1"),
            ]);
            all.insert(k.to_string(), v.to_string());
            let e = Env::from_vars(Command::Add, &all).unwrap_err();
            assert_eq!(e.code, 4, "{k}");
            assert!(
                e.msg.contains(k) && e.msg.contains("not valid UTF-8"),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn del_allows_empty_netns_and_status_needs_nothing() {
        let env = Env::from_vars(
            Command::Del,
            &vars(&[
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "net1"),
                ("CNI_NETNS", ""),
            ]),
        )
        .unwrap();
        assert!(env.netns.is_none());
        Env::from_vars(Command::Status, &vars(&[])).unwrap();
        Env::from_vars(Command::Gc, &vars(&[])).unwrap();
    }

    #[test]
    fn ifname_rules() {
        for bad in [
            "",
            "sixteen-chars-xx",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            ".",
            "..",
        ] {
            if bad.is_empty() {
                continue; // empty means unset, covered above
            }
            assert_eq!(validate_ifname(bad).unwrap_err().code, 4, "{bad:?}");
        }
        for good in ["net1", "eth0", "fifteen-chars-x", "a.b", "enp5s0"] {
            validate_ifname(good).unwrap();
        }
    }

    #[test]
    fn container_id_rules() {
        for bad in ["-abc", "a b", "a/b", "_x", "ünï"] {
            assert_eq!(validate_container_id(bad).unwrap_err().code, 4, "{bad:?}");
        }
        for good in ["abc", "0a.b_c-d", "cnitool-0123456789abcdef0123"] {
            validate_container_id(good).unwrap();
        }
    }

    #[test]
    fn cni_args_multus_shape() {
        let a = CniArgs::parse("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=cid;K8S_POD_UID=uid;IP=10.1.2.9/24,fd00::9/64").unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("pod"));
        assert_eq!(a.get("IP"), Some("10.1.2.9/24,fd00::9/64"));
        assert_eq!(a.get("MAC"), None);
        assert_eq!(CniArgs::parse("A=1;A=2").unwrap().get("A"), Some("2"));
        assert_eq!(CniArgs::parse("A=1;;B=").unwrap().get("B"), Some(""));
        assert_eq!(CniArgs::parse("garbage").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("=v").unwrap_err().code, 4);
    }
}
