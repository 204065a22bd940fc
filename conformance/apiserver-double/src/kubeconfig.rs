//! A kubeconfig for clients of the double.

/// A self-signed certificate (its key was thrown away) that only fills the kubeconfig's
/// `certificate-authority-data`, as every real cluster's kubeconfig has one: a client then
/// trusts just that certificate instead of loading the operating system's trust store, which
/// would make every client construction (one per CNI call) needlessly slow. The double itself
/// speaks plain HTTP, so the certificate is never used.
pub const PLACEHOLDER_CA_PEM_BASE64: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJuRENDQVVHZ0F3SUJBZ0lVVlQxUHJmSm9kUDdweWpaeGxpYThxN29EVVdJd0NnWUlLb1pJemowRUF3SXcKSWpFZ01CNEdBMVVFQXd3WGRHVjBhR1Z5TFdGd2FYTmxjblpsY2kxa2IzVmliR1V3SUJjTk1qWXhNVE13TURjMQpNek14V2hnUE1qRXlOakV4TURZd056VXpNekZhTUNJeElEQWVCZ05WQkFNTUYzUmxkR2hsY2kxaGNHbHpaWEoyClpYSXRaRzkxWW14bE1Ga3dFd1lIS29aSXpqMENBUVlJS29aSXpqMERBUWNEUWdBRTVJOG03RHA3WGFnRHRkaGcKaTc2N2RVWVdOSXdsOUxMTUhtSm0ycnh4ZmFPa3hUaVdhbVh6VGFYVFM3ZFI1VzFZcHlEQktkNmVGUjU0MEE5RgordDFnNWFOVE1GRXdIUVlEVlIwT0JCWUVGSUw4VW12UlhSVER6K0ptWmNpVll2dUVBTVR4TUI4R0ExVWRJd1FZCk1CYUFGSUw4VW12UlhSVER6K0ptWmNpVll2dUVBTVR4TUE4R0ExVWRFd0VCL3dRRk1BTUJBZjh3Q2dZSUtvWkkKemowRUF3SURTUUF3UmdJaEFJM0dWMzAzT0IrbGt3TzRxZ1FOSVBIT2VDV3NCbmhmOGxvbmFKQS9rWDRLQWlFQQoveUVuc2JINWRuS2RjejRWeS9PekJSM2QrRjlTWWxIS0U4Qk10RjVDUHVJPQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

/// A kubeconfig (YAML) for a server at `url` without credentials.
pub fn kubeconfig_for(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {url}\n    \
         certificate-authority-data: {PLACEHOLDER_CA_PEM_BASE64}\n\
         contexts:\n- name: double\n  context:\n    cluster: double\n    user: double\n\
         current-context: double\nusers:\n- name: double\n  user: {{}}\n"
    )
}
