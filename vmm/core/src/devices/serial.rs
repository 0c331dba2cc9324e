//! The console behind the 16550: guest bytes become `[guest] ` prefixed
//! lines on stderr (or a memory sink in tests), capped in volume so a guest
//! cannot flood the host.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The serial device's interrupt line: tiervm guests poll, so it goes nowhere.
pub struct NoIrq;

impl vm_superio::Trigger for NoIrq {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        Ok(())
    }
}

/// Where console lines go.
#[derive(Clone)]
pub enum Sink {
    /// The process's stderr.
    Stderr,
    /// A buffer (tests).
    Memory(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    /// An in-memory sink.
    pub fn memory() -> Self {
        Self::Memory(Arc::default())
    }

    /// What an in-memory sink received.
    pub fn contents(&self) -> String {
        match self {
            Self::Stderr => String::new(),
            Self::Memory(m) => {
                String::from_utf8_lossy(&m.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
            }
        }
    }

    fn emit(&self, line: &[u8]) {
        match self {
            Self::Stderr => {
                let mut e = std::io::stderr().lock();
                if std::io::IsTerminal::is_terminal(&e) {
                    // Clear a live progress line before printing over it.
                    let _ = e.write_all(b"\r\x1b[K");
                }
                let _ = e.write_all(b"[guest] ");
                let _ = e.write_all(line);
                let _ = e.write_all(b"\n");
            }
            Self::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
                m.extend_from_slice(b"[guest] ");
                m.extend_from_slice(line);
                m.push(b'\n');
            }
        }
    }
}

/// Longest console line kept; longer lines are split.
const MAX_LINE: usize = 1024;

/// Line-buffering, volume-capped console writer.
pub struct ConsoleWriter {
    sink: Sink,
    line: Vec<u8>,
    limit: u64,
    written: u64,
    dropped: u64,
}

impl ConsoleWriter {
    /// A writer to `sink` that forwards at most `limit` bytes.
    pub fn new(sink: Sink, limit: u64) -> Self {
        Self {
            sink,
            line: Vec::new(),
            limit,
            written: 0,
            dropped: 0,
        }
    }

    /// Bytes dropped over the limit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes forwarded.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Emits a partial line, if any.
    pub fn flush_line(&mut self) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.sink.emit(&line);
        }
    }

    fn push(&mut self, b: u8) {
        if self.written >= self.limit {
            self.dropped += 1;
            return;
        }
        self.written += 1;
        match b {
            b'\n' => {
                let line = std::mem::take(&mut self.line);
                self.sink.emit(&line);
            }
            b'\r' => {}
            // Keep the terminal safe: printable ASCII and tabs only.
            0x20..=0x7e | b'\t' => self.line.push(b),
            _ => self.line.push(b'?'),
        }
        if self.line.len() >= MAX_LINE {
            self.flush_line();
        }
    }
}

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            self.push(b);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_volume_and_sanitises() {
        let sink = Sink::memory();
        let mut w = ConsoleWriter::new(sink.clone(), 8);
        w.write_all(b"ab\x1b[2Jcdefghijkl\n").unwrap();
        w.flush_line();
        assert_eq!(sink.contents(), "[guest] ab?[2Jcd\n");
        assert_eq!(w.written(), 8);
        assert_eq!(w.dropped(), 9);
    }
}
