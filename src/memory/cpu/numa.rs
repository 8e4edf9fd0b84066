//! NUMA-bound memory: the host's topology from sysfs, `mbind` before first touch, and a
//! kernel query for where a page really is.
//!
//! libnuma is not used (its Rust binding does not build here); the three syscalls it wraps
//! are enough.

use crate::error::{Error, Result};
use crate::os::Mapping;

const NODE_DIR: &str = "/sys/devices/system/node";

/// The NUMA nodes of this host that have memory, read once per [`Context`](crate::memory::Context).
#[derive(Clone, Debug)]
pub struct NumaTopology {
    nodes: Vec<u32>,
    /// False when the kernel has no NUMA support (no sysfs node directory): everything is
    /// node 0 and `mbind` is skipped.
    kernel_numa: bool,
}

impl NumaTopology {
    pub fn detect() -> Self {
        match crate::os::system::numa_node_list(NODE_DIR).and_then(|text| parse_node_list(text.trim())) {
            Some(nodes) if !nodes.is_empty() => NumaTopology { nodes, kernel_numa: true },
            _ => {
                crate::logging::log_first!(
                    log::Level::Info,
                    "the kernel reports no NUMA topology ({NODE_DIR}/has_memory and online are missing or unreadable): \
                     all memory counts as node 0 and NUMA-bound memory is not bound. Mount sysfs in containers to \
                     bind memory to NUMA nodes"
                );
                NumaTopology { nodes: vec![0], kernel_numa: false }
            }
        }
    }

    /// The nodes with memory, ascending.
    pub fn nodes(&self) -> &[u32] {
        &self.nodes
    }

    /// Resolves a request (`None` = the calling thread's node) to an existing node, or says
    /// which nodes exist.
    pub fn resolve(&self, node: Option<u32>) -> Result<u32> {
        let node = match node {
            Some(node) => node,
            None => match crate::types::current_numa_node() {
                Some(n) if self.nodes.contains(&n) => n,
                current => {
                    let first = self.nodes[0];
                    crate::logging::log_first!(
                        log::Level::Info,
                        "NUMA memory for the calling thread's node was asked for, but {}: it is bound to node {first}; \
                         name the node explicitly to choose another",
                        match current {
                            Some(n) => format!("that node ({n}) has no memory"),
                            None => "the thread's node is unknown".to_owned(),
                        }
                    );
                    first
                }
            },
        };
        if self.nodes.contains(&node) {
            Ok(node)
        } else {
            Err(Error::invalid(format!(
                "NUMA node {node} does not exist on this host; the nodes with memory are {}",
                self.describe()
            )))
        }
    }

    fn describe(&self) -> String {
        let list: Vec<String> = self.nodes.iter().map(u32::to_string).collect();
        list.join(", ")
    }
}

/// Parses the kernel's node list format, e.g. `0-3,5`.
fn parse_node_list(text: &str) -> Option<Vec<u32>> {
    let mut nodes = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (first.parse::<u32>().ok()?, last.parse::<u32>().ok()?);
                if last < first || last - first > 4096 {
                    return None;
                }
                nodes.extend(first..=last);
            }
            None => nodes.push(part.parse().ok()?),
        }
    }
    Some(nodes)
}

/// Binds every page of `mapping` to `node`. Must run before the pages are first touched: the
/// policy decides where pages are allocated, it does not move pages already there. On a
/// shared (memfd) mapping the policy is the file's, so pages another process faults in land
/// on the node too.
pub(crate) fn bind(mapping: &Mapping, node: u32, topology: &NumaTopology) -> Result<()> {
    if !topology.kernel_numa {
        return Ok(());
    }
    // SAFETY: the range is exactly the mapping this process owns.
    let bound = unsafe { crate::os::system::bind_to_node(mapping.as_ptr(), mapping.len(), node) };
    if let Err(err) = bound {
        if err.raw_os_error() == Some(libc::ENOSYS) && node == 0 {
            crate::logging::log_first!(
                log::Level::Info,
                "mbind is not available here (ENOSYS: a kernel without NUMA support, or a seccomp filter): memory for \
                 NUMA node 0 is left unbound"
            );
            return Ok(());
        }
        return Err(Error::os(format!("mbind({} bytes to NUMA node {node})", mapping.len()), err));
    }
    Ok(())
}

/// The NUMA node of the page holding `addr`, asked of the kernel (`get_mempolicy` with
/// `MPOL_F_NODE | MPOL_F_ADDR`). The page is faulted in if it was not yet.
// The pointer is only handed to the kernel, which checks it (EFAULT); nothing here reads it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn node_of_address(addr: *const u8) -> Result<u32> {
    let node = crate::os::system::node_of_address(addr)?;
    u32::try_from(node).map_err(|_| Error::Io {
        context: format!("get_mempolicy(node of address {addr:p})"),
        source: std::io::Error::other(format!("kernel answered node {node}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_parse() {
        assert_eq!(parse_node_list("0"), Some(vec![0]));
        assert_eq!(parse_node_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_node_list("x"), None);
        assert_eq!(parse_node_list("3-1"), None);
    }

    #[test]
    fn missing_node_names_the_existing_ones() {
        let topology = NumaTopology::detect();
        assert!(topology.nodes().contains(&topology.resolve(None).unwrap()));
        let err = topology.resolve(Some(4000)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("NUMA node 4000 does not exist"), "{text}");
        assert!(text.contains(&topology.nodes()[0].to_string()), "{text}");
    }

    // mbind and get_mempolicy are Linux's.
    #[cfg(target_os = "linux")]
    #[test]
    fn bound_pages_land_on_their_node() {
        let topology = NumaTopology::detect();
        let node = topology.nodes()[0];
        let fd = crate::os::shm::create("lf-numa-test", 1 << 16, Default::default()).unwrap();
        let mapping = Mapping::shared(&fd, 0, 1 << 16).unwrap();
        bind(&mapping, node, &topology).unwrap();
        // SAFETY: the mapping is live and 64 KiB long.
        unsafe { mapping.as_ptr().add(8192).write(1) };
        assert_eq!(node_of_address(mapping.as_ptr().wrapping_add(8192)).unwrap(), node);
    }
}
