//! The `tiervm` subcommands, one module each.

pub mod compare;
pub mod emulation_check;
pub mod info;
pub mod native;
pub mod run;
pub mod sim;
