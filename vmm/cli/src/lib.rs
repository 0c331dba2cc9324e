//! The `tiervm` command line: one module per subcommand that turns its
//! arguments into calls of `tiervm-core` (a VM) and `tiervm-service` (the
//! service), the presentation of their results (tables, CSV, SVG plots, the
//! progress line) and the one error type with the exit codes and fixes.
//!
//! See `docs/architecture.md` for the packages, the threads and the data path.

pub mod choice;
pub mod commands;
pub mod error;
pub mod flags;
pub mod output;
pub mod presentation;
