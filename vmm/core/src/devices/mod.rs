//! Port-I/O devices: the 16550 console (vm-superio) on COM1.

pub mod serial;

use tiervm_guest::abi::PORT_SERIAL;

use serial::{ConsoleWriter, NoIrq};

/// Dispatches guest port I/O to devices.
pub struct PortBus {
    serial: vm_superio::Serial<NoIrq, vm_superio::serial::NoEvents, ConsoleWriter>,
}

impl PortBus {
    /// A bus with a console that writes guest output through `console`.
    pub fn new(console: ConsoleWriter) -> Self {
        Self {
            serial: vm_superio::Serial::new(NoIrq, console),
        }
    }

    /// Handles a guest `out`; `false` if no device claims `port`.
    pub fn io_out(&mut self, port: u16, data: &[u8]) -> bool {
        match port.checked_sub(PORT_SERIAL) {
            Some(off @ 0..=7) => {
                if let Some(&b) = data.first() {
                    // Errors only come from the interrupt trigger, which never fails.
                    let _ = self.serial.write(off as u8, b);
                }
                true
            }
            _ => false,
        }
    }

    /// Handles a guest `in`; `false` if no device claims `port`.
    pub fn io_in(&mut self, port: u16, data: &mut [u8]) -> bool {
        match port.checked_sub(PORT_SERIAL) {
            Some(off @ 0..=7) => {
                let v = self.serial.read(off as u8);
                data.fill(0);
                if let Some(b) = data.first_mut() {
                    *b = v;
                }
                true
            }
            _ => false,
        }
    }

    /// The console sink (for its counters).
    pub fn console(&self) -> &ConsoleWriter {
        self.serial.writer()
    }

    /// Flushes a partial console line.
    pub fn flush_console(&mut self) {
        self.serial.writer_mut().flush_line();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_lines_reach_the_console_and_other_ports_are_unclaimed() {
        let sink = serial::Sink::memory();
        let mut bus = PortBus::new(ConsoleWriter::new(sink.clone(), 1 << 20));
        for b in b"hello\nwor" {
            assert!(bus.io_out(PORT_SERIAL, &[*b]));
        }
        bus.flush_console();
        assert_eq!(sink.contents(), "[guest] hello\n[guest] wor\n");
        assert!(!bus.io_out(0x80, &[1]));
        let mut d = [0u8; 1];
        assert!(
            bus.io_in(PORT_SERIAL + 5, &mut d),
            "line status register readable"
        );
        assert!(d[0] & 0x20 != 0, "THR empty");
    }
}
