//! Property tests over all policies.
