//! Layer 0: who a process is and where it runs, and whether two processes share a host.

use std::fmt;

use crate::error::{Error, Result};

/// The longest [`ProcessName`], in bytes. Names become parts of shared-memory object names,
/// which the kernel limits to 255 bytes; this leaves room for lava-flow's own prefixes.
pub const MAX_NAME_LEN: usize = 64;

/// The longest hostname DNS allows (RFC 1123: 253 bytes of labels and dots).
pub const MAX_HOSTNAME_LEN: usize = 253;

/// The longest label (the part between dots) of a hostname.
pub const MAX_HOSTNAME_LABEL_LEN: usize = 63;

/// The longest host identity (see [`ProcessLocation::host_id`]), in bytes.
pub const MAX_HOST_ID_LEN: usize = 255;

/// The environment variable that overrides the detected host identity.
pub const HOST_ID_ENV: &str = crate::env::HOST_ID.name;

/// A validated name for a process (or, later, a channel): 1 to [`MAX_NAME_LEN`] bytes of
/// ASCII letters, digits, `-`, `_` and `.`, not starting with `.`.
///
/// The character set is what can go into a file name, a shared-memory object name and a
/// JSON key without quoting, so a name is usable everywhere lava-flow puts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessName(String);

impl ProcessName {
    pub fn new(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid("process name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "process name {name:?} is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
            return Err(Error::invalid(format!(
                "process name {name:?} contains {bad:?}; use ASCII letters, digits, '-', '_' and '.'"
            )));
        }
        if name.starts_with('.') {
            return Err(Error::invalid(format!("process name {name:?} starts with '.'")));
        }
        Ok(ProcessName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProcessName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a process runs: its host, and optionally its NUMA node and GPU.
///
/// `hostname` (or `host_id`, when both sides have one) decides the [`CommunicationScope`];
/// `node_id` and `device_id` steer memory placement (a NUMA node for CPU buffers, a GPU for
/// device buffers) and are `None` when unknown or irrelevant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLocation {
    pub hostname: String,
    pub node_id: Option<u32>,
    pub device_id: Option<u32>,
    /// Which machine, kernel and namespaces the process runs in, when known: processes with
    /// equal host identities can share memory. Hostnames alone cannot tell two containers on
    /// one machine apart (or may be equal on two machines); see [`detect_host_id`]. `None`
    /// for locations built by hand or read from a config file, which are compared by hostname.
    pub host_id: Option<String>,
    /// How to reach the process through MPI, for locations found by MPI discovery
    /// (`MpiWorld::peer`): what a channel to a peer on another host addresses.
    pub mpi: Option<MpiAddress>,
    /// The process's name, for locations read from a config file: where this process has
    /// joined MPI, a channel finds the process of that name through discovery (its rank and
    /// its host identity), so a location from a config file reaches a peer on another host.
    pub name: Option<ProcessName>,
}

/// A process in an MPI world lava-flow joined: the world (its id in this process) and the
/// process's rank there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MpiAddress {
    pub world: u64,
    pub rank: u32,
}

impl ProcessLocation {
    /// Builds a location by hand, checking the hostname.
    pub fn new(hostname: &str, node_id: Option<u32>, device_id: Option<u32>) -> Result<Self> {
        validate_hostname(hostname)?;
        Ok(ProcessLocation { hostname: hostname.to_owned(), node_id, device_id, host_id: None, mpi: None, name: None })
    }

    /// The same location with a host identity, checked like `LF_HOST_ID`.
    pub fn with_host_id(mut self, host_id: &str) -> Result<Self> {
        validate_host_id(host_id)?;
        self.host_id = Some(host_id.to_owned());
        Ok(self)
    }

    /// Detects the calling process's location: the kernel's hostname, the host identity
    /// ([`detect_host_id`]: `LF_HOST_ID` if set) and the NUMA node of the CPU the calling
    /// thread runs on now. `device_id` is left unset: which GPU a process uses is its own
    /// choice, not something the host can tell.
    pub fn from_hostname() -> Result<Self> {
        let hostname = detect_hostname()?;
        Ok(ProcessLocation {
            hostname,
            node_id: current_numa_node(),
            device_id: None,
            host_id: detect_host_id()?,
            mpi: None,
            name: None,
        })
    }
}

impl fmt::Display for ProcessLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.hostname)?;
        if let Some(node) = self.node_id {
            write!(f, " numa-node={node}")?;
        }
        if let Some(device) = self.device_id {
            write!(f, " device={device}")?;
        }
        if let Some(host_id) = &self.host_id {
            write!(f, " host-id={host_id}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ProcessLocation {
    type Err = Error;

    /// Reads a location as [`Display`](fmt::Display) writes it: a hostname, then optional
    /// `numa-node=N`, `device=N` and `host-id=ID`, separated by spaces or commas
    /// (`gpu-node-0 host-id=rack1-7`, `gpu-node-0,numa-node=1`). Every part is checked as
    /// [`ProcessLocation::new`] and [`ProcessLocation::with_host_id`] check it.
    fn from_str(text: &str) -> Result<Self> {
        let mut parts = text.split(|c: char| c == ',' || c.is_ascii_whitespace()).filter(|p| !p.is_empty());
        let hostname = parts.next().ok_or_else(|| Error::invalid("the location is empty; give at least a hostname"))?;
        if hostname.contains('=') {
            return Err(Error::invalid(format!(
                "location {text:?} starts with {hostname:?}; it must start with a hostname"
            )));
        }
        let mut location = ProcessLocation::new(hostname, None, None)?;
        for part in parts {
            let number = |value: &str, what: &str| {
                value.parse::<u32>().map_err(|_| {
                    Error::invalid(format!("{what} {value:?} in location {text:?} is not a non-negative integer"))
                })
            };
            match part.split_once('=') {
                Some(("numa-node", value)) => location.node_id = Some(number(value, "numa-node")?),
                Some(("device", value)) => location.device_id = Some(number(value, "device")?),
                Some(("host-id", value)) => location = location.with_host_id(value)?,
                _ => {
                    return Err(Error::invalid(format!(
                        "{part:?} in location {text:?} is not numa-node=N, device=N or host-id=ID"
                    )))
                }
            }
        }
        Ok(location)
    }
}

/// Whether two processes can share memory (same host) or must go through the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommunicationScope {
    /// Same host: Vulkan IPC for GPU buffers, OS shared memory for CPU buffers.
    Local,
    /// Different hosts: MPI.
    Remote,
}

impl fmt::Display for CommunicationScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommunicationScope::Local => "local",
            CommunicationScope::Remote => "remote",
        })
    }
}

/// Two processes are local to each other when their host identities match, if both have one;
/// otherwise when their hostnames match. Hostnames are compared without regard to ASCII case,
/// as DNS does; host identities exactly.
pub fn detect_scope(mine: &ProcessLocation, peer: &ProcessLocation) -> CommunicationScope {
    let same_host = match (&mine.host_id, &peer.host_id) {
        (Some(mine), Some(peer)) => mine == peer,
        _ => mine.hostname.eq_ignore_ascii_case(&peer.hostname),
    };
    if same_host {
        CommunicationScope::Local
    } else {
        CommunicationScope::Remote
    }
}

/// [`detect_scope`] with the reason in words, for reports: which hostnames or host identities
/// were compared.
pub fn explain_scope(mine: &ProcessLocation, peer: &ProcessLocation) -> (CommunicationScope, String) {
    let scope = detect_scope(mine, peer);
    let text = match (&mine.host_id, &peer.host_id, scope) {
        (Some(id), Some(_), CommunicationScope::Local) => {
            format!("same host ({}, host identity {id:?}): scope local", mine.hostname)
        }
        (Some(mine_id), Some(peer_id), CommunicationScope::Remote) => format!(
            "peer host {:?} (host identity {peer_id:?}) differs from this host {:?} (host identity {mine_id:?}): \
             scope remote",
            peer.hostname, mine.hostname
        ),
        (_, _, CommunicationScope::Local) => format!("same host ({}): scope local", mine.hostname),
        (_, _, CommunicationScope::Remote) => {
            format!("peer host {:?} differs from this host {:?}: scope remote", peer.hostname, mine.hostname)
        }
    };
    (scope, text)
}

/// This process's host identity: `LF_HOST_ID` when it is set and not empty, otherwise what
/// the kernel tells (see below), or `None` where it tells nothing (then locations fall back to
/// comparing hostnames).
///
/// The detected identity is the boot id (`/proc/sys/kernel/random/boot_id`: one running
/// kernel, so one machine) and the inode numbers of the UTS, IPC and network namespaces
/// (`/proc/self/ns/*`). Two processes with the same identity run on one kernel in the same
/// namespaces, so they can share memory and reach each other's sockets; two containers on one
/// machine differ, and are treated as different hosts.
///
/// `LF_HOST_ID` overrides it: to group containers that can share memory after all, or for
/// tests that simulate several hosts on one machine.
pub fn detect_host_id() -> Result<Option<String>> {
    host_id_from(std::env::var_os(HOST_ID_ENV))
}

/// [`detect_host_id`] with the value of `LF_HOST_ID` given.
fn host_id_from(override_value: Option<std::ffi::OsString>) -> Result<Option<String>> {
    let Some(value) = override_value.filter(|v| !v.is_empty()) else {
        let id = kernel_host_id();
        if id.is_none() {
            crate::logging::log_first!(
                log::Level::Info,
                "this host's identity cannot be read from /proc (the boot id and /proc/self/ns): processes are taken \
                 to share a host when their hostnames are equal; set {HOST_ID_ENV} to the same value in processes \
                 that can share memory"
            );
        }
        return Ok(id);
    };
    let value = value.into_string().map_err(|_| {
        Error::invalid(format!("{HOST_ID_ENV} is not valid UTF-8; set it to a short ASCII name, or unset it"))
    })?;
    if let Some(problem) = host_id_problem(&value) {
        return Err(Error::invalid(format!(
            "{HOST_ID_ENV}: {problem}; set it to a short ASCII name (the same for processes that share memory), or unset it"
        )));
    }
    Ok(Some(value))
}

fn kernel_host_id() -> Option<String> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let mut id = boot_id.trim().to_owned();
    // Only complete identities: leaving a namespace out could call two containers one host.
    for namespace in ["uts", "ipc", "net"] {
        let link = std::fs::read_link(format!("/proc/self/ns/{namespace}")).ok()?;
        id.push('/');
        id.push_str(link.to_str()?);
    }
    host_id_problem(&id).is_none().then_some(id)
}

/// Checks a host identity: 1 to [`MAX_HOST_ID_LEN`] bytes of printable ASCII without spaces.
pub(crate) fn validate_host_id(host_id: &str) -> Result<()> {
    match host_id_problem(host_id) {
        Some(problem) => Err(Error::invalid(problem)),
        None => Ok(()),
    }
}

fn host_id_problem(host_id: &str) -> Option<String> {
    if host_id.is_empty() {
        return Some("host identity is empty".into());
    }
    if host_id.len() > MAX_HOST_ID_LEN {
        return Some(format!("host identity is {} bytes long; the limit is {MAX_HOST_ID_LEN}", host_id.len()));
    }
    host_id
        .chars()
        .find(|c| !c.is_ascii_graphic())
        .map(|bad| format!("host identity {host_id:?} contains {bad:?}; use printable ASCII without spaces"))
}

/// Checks a hostname against RFC 1123: dot-separated labels of 1 to 63 ASCII letters, digits
/// and `-` (not first or last in a label), 253 bytes at most. `_` is accepted too, since some
/// sites name hosts with it; nothing else is (no `/`, spaces or control characters).
pub(crate) fn validate_hostname(hostname: &str) -> Result<()> {
    if hostname.is_empty() {
        return Err(Error::invalid("hostname is empty"));
    }
    if hostname.len() > MAX_HOSTNAME_LEN {
        return Err(Error::invalid(format!(
            "hostname is {} bytes long; the limit is {MAX_HOSTNAME_LEN}",
            hostname.len()
        )));
    }
    if let Some(bad) = hostname.chars().find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))) {
        return Err(Error::invalid(format!(
            "hostname {hostname:?} contains {bad:?}; use ASCII letters, digits, '-', '_' and '.' (RFC 1123)"
        )));
    }
    for label in hostname.split('.') {
        if label.is_empty() {
            return Err(Error::invalid(format!(
                "hostname {hostname:?} has an empty label (it starts or ends with '.', or has '..')"
            )));
        }
        if label.len() > MAX_HOSTNAME_LABEL_LEN {
            return Err(Error::invalid(format!(
                "hostname {hostname:?} has a label of {} bytes; the limit is {MAX_HOSTNAME_LABEL_LEN}",
                label.len()
            )));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(Error::invalid(format!(
                "hostname {hostname:?} has a label {label:?} that starts or ends with '-'"
            )));
        }
    }
    Ok(())
}

#[cfg(windows)]
fn detect_hostname() -> Result<String> {
    let hostname = crate::os::system::hostname().map_err(|e| Error::os("GetComputerNameExW(DNS host name)", e))?;
    validate_hostname(&hostname)?;
    Ok(hostname)
}

#[cfg(unix)]
fn detect_hostname() -> Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of buf.len() bytes; gethostname NUL-terminates
    // within that length on Linux when the name fits, and HOST_NAME_MAX (64) + 1 always fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(Error::last_os("gethostname"));
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let hostname = String::from_utf8_lossy(&buf[..len]).into_owned();
    validate_hostname(&hostname)?;
    Ok(hostname)
}

/// The NUMA node of the CPU the calling thread is running on, if the kernel tells.
pub(crate) fn current_numa_node() -> Option<u32> {
    crate::os::system::current_numa_node()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(ProcessName::new("producer-0.gpu_a").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
            let err = ProcessName::new(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err}");
        }
        assert!(ProcessName::new(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn scope_compares_hostnames_case_insensitively() {
        let a = ProcessLocation::new("Node0", Some(0), None).unwrap();
        let b = ProcessLocation::new("node0", Some(1), Some(3)).unwrap();
        let c = ProcessLocation::new("node1", Some(0), None).unwrap();
        assert_eq!(detect_scope(&a, &b), CommunicationScope::Local);
        assert_eq!(detect_scope(&a, &c), CommunicationScope::Remote);
    }

    #[test]
    fn this_process_is_local_to_itself() {
        let me = ProcessLocation::from_hostname().unwrap();
        assert!(!me.hostname.is_empty());
        assert_eq!(detect_scope(&me, &me), CommunicationScope::Local);
        // Every Linux machine has node 0 at least; getcpu never reports a node that is absent.
        let node = me.node_id.expect("getcpu reports a NUMA node on Linux");
        assert!(std::path::Path::new(&format!("/sys/devices/system/node/node{node}")).exists() || node == 0);
    }

    #[test]
    fn scope_compares_host_ids_when_both_sides_have_one() {
        let a = ProcessLocation::new("node0", None, None).unwrap().with_host_id("box-a").unwrap();
        let a_again = ProcessLocation::new("other-name", None, None).unwrap().with_host_id("box-a").unwrap();
        let b = ProcessLocation::new("node0", None, None).unwrap().with_host_id("box-b").unwrap();
        let plain = ProcessLocation::new("NODE0", None, None).unwrap();
        // Same host identity, different hostnames: one host.
        assert_eq!(detect_scope(&a, &a_again), CommunicationScope::Local);
        // Same hostname, different identities (two containers): two hosts.
        assert_eq!(detect_scope(&a, &b), CommunicationScope::Remote);
        // One side without an identity: hostnames decide, as before.
        assert_eq!(detect_scope(&a, &plain), CommunicationScope::Local);
        assert_eq!(detect_scope(&plain, &b), CommunicationScope::Local);
        assert!(a.to_string().ends_with(" host-id=box-a"), "{a}");
        let (scope, why) = explain_scope(&a, &b);
        assert_eq!(scope, CommunicationScope::Remote);
        assert!(why.contains("\"box-b\") differs from this host \"node0\" (host identity \"box-a\")"), "{why}");
        assert_eq!(explain_scope(&a, &plain).1, "same host (node0): scope local");
    }

    #[test]
    fn host_id_override_and_detection() {
        use std::ffi::OsString;
        assert_eq!(host_id_from(Some("rack1-node7".into())).unwrap().as_deref(), Some("rack1-node7"));
        // Empty means unset: the kernel's identity, the same on every call in this process.
        let detected = host_id_from(Some(OsString::new())).unwrap();
        assert_eq!(detected, host_id_from(None).unwrap());
        #[cfg(target_os = "linux")]
        {
            let detected = detected.expect("Linux has a boot id and namespaces in /proc");
            assert!(detected.contains("/uts:[") && detected.contains("/net:["), "{detected}");
        }
        for bad in ["a b", "tab\t", "é", &"x".repeat(MAX_HOST_ID_LEN + 1)] {
            let err = host_id_from(Some(bad.into())).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, Error::InvalidArgument(_)) && msg.contains("LF_HOST_ID") && msg.contains("unset it"),
                "{bad:?}: {msg}"
            );
        }
        assert!(ProcessLocation::new("h", None, None).unwrap().with_host_id("").is_err());
    }

    #[test]
    fn locations_read_back_what_display_writes() {
        let full = ProcessLocation::new("gpu-node-0", Some(1), Some(3)).unwrap().with_host_id("rack1/7").unwrap();
        assert_eq!(full.to_string().parse::<ProcessLocation>().unwrap(), full);
        let plain: ProcessLocation = " node7 ".parse().unwrap();
        assert_eq!(plain, ProcessLocation::new("node7", None, None).unwrap());
        let commas: ProcessLocation = "node7,host-id=box-a,numa-node=0".parse().unwrap();
        assert_eq!((commas.host_id.as_deref(), commas.node_id), (Some("box-a"), Some(0)));
        for bad in ["", "host-id=x", "node7 numa-node=-1", "node7 gpu=1", "node7 device=", "bad/host", "node7 host-id="]
        {
            let err = bad.parse::<ProcessLocation>().unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err}");
        }
    }

    #[test]
    fn hostnames_are_validated() {
        let longest = vec!["b".repeat(63); 4].join(".")[..253].to_owned();
        for good in ["h", "node-0", "gpu-node-0.cluster.example.org", "Node_7", &"a".repeat(63), &longest] {
            assert!(ProcessLocation::new(good, None, None).is_ok(), "{good:?}");
        }
        let long_label = "a".repeat(64);
        let too_long = vec!["b".repeat(63); 4].join(".");
        for bad in [
            "",
            "a b",
            "a/b",
            "../x",
            "a\\b",
            "é",
            "a\n",
            ".a",
            "a.",
            "a..b",
            "-a",
            "a-",
            "x.-y",
            &long_label,
            &too_long,
        ] {
            let err = ProcessLocation::new(bad, None, None).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("hostname"), "{bad:?}: {err}");
        }
    }
}
