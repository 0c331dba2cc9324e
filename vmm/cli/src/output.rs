//! Writing to stdout and stderr without panicking.
//!
//! Rust's `print!` panics when stdout is a closed pipe (`tiervm run | head -1`)
//! or a full disk (`> /dev/full`). Here a reader that went away (EPIPE) ends
//! the output quietly (the command exits as it would have), and any other
//! write error becomes one clear error line and a non-zero exit.

use std::io::{ErrorKind, Write};

use crate::error::{OutputError, Result};

/// Writes `text` to stdout and flushes it. A closed pipe (EPIPE) is not an
/// error: whoever wanted the output stopped reading. Any other failure
/// (ENOSPC, EIO, ...) is an [`OutputError::Write`].
pub fn stdout(text: &str) -> Result<()> {
    write_stdout(text).map_err(|e| OutputError::Write(e).into())
}

/// [`stdout`] with the I/O error itself.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Writes one line to stderr; failures are ignored (there is nowhere left
/// to report them).
pub fn stderr_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err
        .write_all(line.as_bytes())
        .and_then(|()| err.write_all(b"\n"));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_full_disk_is_an_error_naming_it() {
        // The process's stdout is the test harness's; write to /dev/full
        // through the same logic instead.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        use std::io::Write;
        let e = f.write_all(b"x").and_then(|()| f.flush()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    }
}
