//! Where the cluster store's credentials come from (`kubernetes.kubeconfig`, in-cluster,
//! `KUBECONFIG`): the one reader of a kubeconfig file, the client configuration built from it, and
//! the offline check `doctor` runs.

use std::path::Path;

use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::error_chain;
use crate::error::{CredentialSource, KubeStoreError};
use crate::settings::KubeSettings;

/// The largest kubeconfig file read.
const MAX_KUBECONFIG: u64 = 1 << 20;

/// The kubeconfig at `p`, read as both the store and `doctor` read it: one open, then a bounded
/// read of that file (a kubeconfig is a few KiB, and a huge file, or one swapped in after a size
/// check, is refused without being read whole), then parsed.
fn read_kubeconfig(p: &Path, source: &CredentialSource) -> Result<Kubeconfig, KubeStoreError> {
    let bad = |detail: String| KubeStoreError::Kubeconfig {
        source_: source.clone(),
        detail,
    };
    let file = std::fs::File::open(p).map_err(|e| {
        bad(if e.kind() == std::io::ErrorKind::NotFound {
            "the file does not exist".to_string()
        } else {
            e.to_string()
        })
    })?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(bad("not a regular file".to_string()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_KUBECONFIG + 1),
        &mut text,
    )
    .map_err(|e| bad(e.to_string()))?;
    if text.len() as u64 > MAX_KUBECONFIG {
        return Err(bad(format!(
            "the file is too large for a kubeconfig (at most {} KiB)",
            MAX_KUBECONFIG >> 10
        )));
    }
    Kubeconfig::from_yaml(&text).map_err(|e| bad(error_chain(&e)))
}

/// The client configuration and where its credentials came from: `kubernetes.kubeconfig`, else
/// in-cluster, else `KUBECONFIG`.
pub(crate) async fn load_config(
    settings: &KubeSettings,
) -> Result<(Config, CredentialSource), KubeStoreError> {
    let options = KubeConfigOptions {
        context: settings.context.clone(),
        ..KubeConfigOptions::default()
    };
    let from_kubeconfig = |kc: Kubeconfig, source: CredentialSource| async move {
        Config::from_custom_kubeconfig(kc, &options)
            .await
            .map(|c| (c, source.clone()))
            .map_err(|e| KubeStoreError::Kubeconfig {
                source_: source,
                detail: error_chain(&e),
            })
    };
    if let Some(p) = &settings.kubeconfig {
        let source = CredentialSource::Config(p.clone());
        let kc = read_kubeconfig(p, &source)?;
        return from_kubeconfig(kc, source).await;
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        if let Some(context) = &settings.context {
            return Err(KubeStoreError::InCluster {
                detail: format!(
                    "context {context:?} was asked for, but a pod's credential has no contexts"
                ),
            });
        }
        return Config::incluster()
            .map(|c| (c, CredentialSource::InCluster))
            .map_err(|e| KubeStoreError::InCluster {
                detail: error_chain(&e),
            });
    }
    match std::env::var("KUBECONFIG") {
        Ok(v) if !v.trim().is_empty() => {
            let source = CredentialSource::Env(v.clone());
            let kc = Kubeconfig::from_env()
                .map_err(|e| KubeStoreError::Kubeconfig {
                    source_: source.clone(),
                    detail: error_chain(&e),
                })?
                .ok_or(KubeStoreError::NoCredentials)?;
            from_kubeconfig(kc, source).await
        }
        _ => Err(KubeStoreError::NoCredentials),
    }
}

/// What the credentials of `settings` are, checked offline: the kubeconfig parses, has a current
/// context and user, and the user's token (inline or `tokenFile`) or client certificate is
/// readable. Returns a one-line description for `doctor`.
pub fn check_credentials(settings: &KubeSettings) -> Result<String, KubeStoreError> {
    if let Some(p) = &settings.kubeconfig {
        return describe_kubeconfig(p, CredentialSource::Config(p.clone()));
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        let tok = Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token");
        return match std::fs::read_to_string(tok) {
            Ok(t) if !t.trim().is_empty() => Ok(format!(
                "{}: token {}",
                CredentialSource::InCluster,
                tok.display()
            )),
            Ok(_) => Err(KubeStoreError::InCluster {
                detail: format!("{} is empty", tok.display()),
            }),
            Err(e) => Err(KubeStoreError::InCluster {
                detail: format!("cannot read {}: {e}", tok.display()),
            }),
        };
    }
    match std::env::var("KUBECONFIG") {
        Ok(v) if !v.trim().is_empty() => {
            let first = v.split(':').next().unwrap_or(&v).to_string();
            describe_kubeconfig(Path::new(&first), CredentialSource::Env(v.clone()))
        }
        _ => Err(KubeStoreError::NoCredentials),
    }
}

/// [`check_credentials`] of one kubeconfig file.
fn describe_kubeconfig(p: &Path, source: CredentialSource) -> Result<String, KubeStoreError> {
    let bad = |detail: String| KubeStoreError::Kubeconfig {
        source_: source.clone(),
        detail,
    };
    let kc = read_kubeconfig(p, &source)?;
    let ctx_name = kc
        .current_context
        .clone()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("no current-context".into()))?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| bad(format!("current-context {ctx_name:?} is not defined")))?;
    let server = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .ok_or_else(|| bad(format!("cluster {:?} has no server", ctx.cluster)))?;
    let user = ctx.user.clone().unwrap_or_default();
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.clone());
    let cred = match auth {
        None => "no user credentials (anonymous)".to_string(),
        Some(a) => describe_user(&a).map_err(bad)?,
    };
    Ok(format!("{source}: server {server}, {cred}"))
}

/// What credential a kubeconfig user carries; files it names must be readable (a token file
/// not empty). The error is the detail of a kubeconfig error.
fn describe_user(a: &kube::config::AuthInfo) -> Result<String, String> {
    Ok(if let Some(f) = &a.token_file {
        let t =
            std::fs::read_to_string(f).map_err(|e| format!("cannot read tokenFile {f}: {e}"))?;
        if t.trim().is_empty() {
            return Err(format!("tokenFile {f} is empty"));
        }
        format!("token from {f}")
    } else if a.token.is_some() {
        "inline token".to_string()
    } else if a.client_certificate_data.is_some() || a.client_certificate.is_some() {
        if let Some(f) = &a.client_certificate {
            std::fs::metadata(f).map_err(|e| format!("cannot read client-certificate {f}: {e}"))?;
        }
        "client certificate".to_string()
    } else if a.exec.is_some() {
        "exec credential plugin (not run by doctor)".to_string()
    } else if a.auth_provider.is_some() {
        "auth-provider (not checked)".to_string()
    } else {
        "no user credentials (anonymous)".to_string()
    })
}
