//! What the user reads: tables, CSV, SVG plots, summaries and their
//! statistics, and the progress line. Subcommands compute; these modules
//! only turn results into text.

pub mod compare;
pub mod plot;
pub mod progress;
pub mod sim;
pub mod stats;
pub mod table;
