//! NUMA placement: `mbind(MPOL_BIND)` of a range of a [`Mapping`], and `move_pages(2)` to
//! query or migrate the node of single pages.

use std::io;

use super::{last_err, Mapping};

const MPOL_BIND: i32 = 2;
const MPOL_MF_MOVE: i32 = 1 << 1;
/// Node ids tiervm supports (the nodemask is one u64).
pub const MAX_NODES: usize = 64;

fn nodemask(nodes: &[u32]) -> io::Result<[u64; 1]> {
    let mut mask = 0u64;
    for &node in nodes {
        if node as usize >= MAX_NODES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "NUMA node {node} is out of range (tiervm supports node ids below {MAX_NODES})"
                ),
            ));
        }
        mask |= 1 << node;
    }
    Ok([mask])
}

impl Mapping {
    /// Binds `[addr, addr+len)`, a range of this mapping, to `nodes`
    /// (`mbind(MPOL_BIND)`): pages faulted in there later come from those
    /// nodes, and NUMA balancing leaves the range alone (it scans only
    /// ranges without an explicit policy). A range outside the mapping is
    /// refused (`InvalidInput`) before any system call.
    pub fn mbind(&self, addr: usize, len: usize, nodes: &[u32]) -> io::Result<()> {
        let mask = nodemask(nodes)?;
        self.check_range(addr, len, "mbind")?;
        // SAFETY: mbind reads `mask` (one u64, maxnode = 65 bits as the kernel expects
        // maxnode-1 significant bits) and changes only the policy of a range of this
        // mapping (checked above), which stays mapped while `self` is borrowed; it moves
        // no page (no MPOL_MF_MOVE) and no byte changes.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                addr,
                len,
                MPOL_BIND,
                mask.as_ptr(),
                MAX_NODES + 1,
                0u32,
            )
        };
        if r < 0 {
            return Err(last_err(&format!(
                "mbind(MPOL_BIND, nodes {nodes:?}) (does the node exist? see /sys/devices/system/node)"
            )));
        }
        Ok(())
    }
}

/// `move_pages(2)` on our own process: with `to_node` the kernel migrates
/// each page there, without it only reports where each page is. Returns
/// the per-page status (node or negative errno).
fn move_pages(addrs: &[usize], to_node: Option<u32>) -> io::Result<Vec<i32>> {
    let mut status = vec![0i32; addrs.len()];
    if addrs.is_empty() {
        return Ok(status);
    }
    let nodes: Option<Vec<i32>> = to_node.map(|n| vec![n as i32; addrs.len()]);
    let (nodes_ptr, flags) = match &nodes {
        Some(n) => (n.as_ptr(), MPOL_MF_MOVE),
        None => (std::ptr::null::<i32>(), 0),
    };
    // SAFETY: `addrs`, `status` and (when given) `nodes` have `addrs.len()`
    // elements. With nodes == NULL the kernel only reports each page's node;
    // otherwise it migrates our own pages, keeping addresses and contents.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            addrs.len(),
            addrs.as_ptr(),
            nodes_ptr,
            status.as_mut_ptr(),
            flags,
        )
    };
    if r < 0 {
        return Err(match to_node {
            Some(n) => last_err(&format!("move_pages to node {n}")),
            None => last_err("move_pages (query)"),
        });
    }
    Ok(status)
}

/// Queries the NUMA node of each page (`move_pages` with `nodes = NULL`).
/// Entries are the node id, or a negative errno (`-ENOENT`: not present).
pub fn query_nodes(addrs: &[usize]) -> io::Result<Vec<i32>> {
    move_pages(addrs, None)
}

/// Migrates each page to `node` with the kernel's own (exclusive) migration,
/// `move_pages(2)`. Returns the per-page status (node or negative errno).
pub fn move_pages_to(addrs: &[usize], node: u32) -> io::Result<Vec<i32>> {
    move_pages(addrs, Some(node))
}
