//! The placement policy a VM may name (`policy` in a request, `--policy`,
//! `[defaults] policy` in serve.toml): one check shared by `config` and
//! `host`, below both.

use super::host_error::HostError;

/// Checks a placement policy name.
pub fn check_policy(name: &str) -> Result<(), HostError> {
    use tiering::policy::PolicyKind;
    if PolicyKind::POLICIES.iter().any(|k| k.name() == name) {
        Ok(())
    } else {
        Err(HostError::bad_request(
            format!("'{name}' is not a placement policy"),
            format!("use one of {}", PolicyKind::names(&PolicyKind::POLICIES)),
        ))
    }
}
