//! Behaviour tests of `adaptive`, each with a scenario built to trigger it.
