//! What `tiervm sim` lists: the built-in scenarios and the policies.

use tiering::policy::PolicyKind;
use tiering::sim;

/// The built-in scenarios with one line each, and the policy names.
pub fn list() -> String {
    let mut s = String::from("built-in scenarios (all results MODELED):\n");
    for scn in sim::builtins() {
        s.push_str(&format!("  {:<18} {}\n", scn.name, scn.about));
    }
    s.push_str(&format!(
        "policies: {} (variants: {})\n",
        PolicyKind::names(&PolicyKind::POLICIES),
        PolicyKind::names(&PolicyKind::VARIANTS)
    ));
    s
}
