//! The `tiervm` subcommands, one module each.

pub mod compare;
pub mod ctl;
pub mod emulation_check;
pub mod info;
pub mod native;
pub mod run;
pub mod serve;
pub mod sim;
pub mod worker;
