//! The process-description file: where each named process of a job runs.
//!
//! ```json
//! {
//!   "processes": [
//!     { "name": "producer", "hostname": "gpu-node-0", "node_id": 0, "device_id": 0 },
//!     { "name": "consumer", "hostname": "gpu-node-1" }
//!   ]
//! }
//! ```
//!
//! `name` and `hostname` are required; `node_id` (NUMA node) and `device_id` (GPU index) are
//! optional non-negative integers. Unknown fields are errors, so that a typo (`node-id`) is
//! reported instead of silently ignored. Every error names the file and the JSON path.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::types::{validate_hostname, ProcessLocation, ProcessName};

/// Config files are small; anything bigger is a mistake (wrong path), not a config.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// All processes a config file describes, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessConfig {
    pub processes: Vec<(ProcessName, ProcessLocation)>,
}

impl ProcessLocation {
    /// Reads the location of the process called `name` from a JSON config file; see
    /// [`crate::config`] for the format.
    pub fn from_config(path: impl AsRef<Path>, name: &ProcessName) -> Result<Self> {
        ProcessConfig::load(path.as_ref())?.location_of(name)
    }
}

impl ProcessConfig {
    pub fn load(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|e| Error::config(path, format!("cannot read it: {e}")))?;
        if !meta.is_file() {
            return Err(Error::config(path, "is not a regular file"));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(Error::config(
                path,
                format!("is {} bytes; a config file is at most {MAX_CONFIG_BYTES}", meta.len()),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::config(path, format!("cannot read it: {e}")))?;
        Self::parse(&text).map_err(|problem| Error::config(path, problem))
    }

    /// Parses config text; the error is the problem without the file name.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let root: Value = serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))?;
        let root = root.as_object().ok_or_else(|| format!("top level must be an object, found {}", kind(&root)))?;
        reject_unknown(root, &["processes"], "top level")?;
        let list = root.get("processes").ok_or("missing field \"processes\" (an array of process descriptions)")?;
        let list = list.as_array().ok_or_else(|| format!("\"processes\" must be an array, found {}", kind(list)))?;

        let mut processes: Vec<(ProcessName, ProcessLocation)> = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            let at = format!("processes[{i}]");
            let obj = entry.as_object().ok_or_else(|| format!("{at} must be an object, found {}", kind(entry)))?;
            reject_unknown(obj, &["name", "hostname", "node_id", "device_id"], &at)?;
            let name = required_str(obj, "name", &at)?;
            let name = ProcessName::new(name).map_err(|e| format!("{at}.name: {e}"))?;
            let hostname = required_str(obj, "hostname", &at)?;
            validate_hostname(hostname).map_err(|e| format!("{at}.hostname: {e}"))?;
            if processes.iter().any(|(n, _)| *n == name) {
                return Err(format!("{at}: process {name:?} is described twice"));
            }
            let location = ProcessLocation {
                hostname: hostname.to_owned(),
                node_id: optional_u32(obj, "node_id", &at)?,
                device_id: optional_u32(obj, "device_id", &at)?,
                host_id: None,
                mpi: None,
                name: Some(name.clone()),
            };
            processes.push((name, location));
        }
        Ok(ProcessConfig { processes })
    }

    pub fn location_of(&self, name: &ProcessName) -> Result<ProcessLocation> {
        self.processes.iter().find(|(n, _)| n == name).map(|(_, loc)| loc.clone()).ok_or_else(|| {
            let known: Vec<&str> = self.processes.iter().map(|(n, _)| n.as_str()).collect();
            Error::NotFound(format!(
                "no process named {:?} in the config; it describes: {}",
                name.as_str(),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ))
        })
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn reject_unknown(obj: &Map<String, Value>, allowed: &[&str], at: &str) -> std::result::Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("{at}: unknown field {k:?}; allowed fields are {}", allowed.join(", "))),
        None => Ok(()),
    }
}

fn required_str<'a>(obj: &'a Map<String, Value>, field: &str, at: &str) -> std::result::Result<&'a str, String> {
    let v = obj.get(field).ok_or_else(|| format!("{at}: missing field {field:?}"))?;
    v.as_str().ok_or_else(|| format!("{at}.{field} must be a string, found {}", kind(v)))
}

fn optional_u32(obj: &Map<String, Value>, field: &str, at: &str) -> std::result::Result<Option<u32>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{at}.{field} must be an integer from 0 to {}, found {v}", u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> String {
        ProcessConfig::parse(text).unwrap_err()
    }

    #[test]
    fn parses_a_valid_config() {
        let cfg = ProcessConfig::parse(
            r#"{"processes":[{"name":"a","hostname":"h0","node_id":1,"device_id":2},
                             {"name":"b","hostname":"h1","device_id":null}]}"#,
        )
        .unwrap();
        let a = cfg.location_of(&ProcessName::new("a").unwrap()).unwrap();
        assert_eq!(
            a,
            ProcessLocation {
                hostname: "h0".into(),
                node_id: Some(1),
                device_id: Some(2),
                host_id: None,
                mpi: None,
                name: Some(ProcessName::new("a").unwrap())
            }
        );
        let b = cfg.location_of(&ProcessName::new("b").unwrap()).unwrap();
        assert_eq!((b.node_id, b.device_id), (None, None));
        let err = cfg.location_of(&ProcessName::new("c").unwrap()).unwrap_err();
        assert!(err.to_string().contains("describes: a, b"), "{err}");
    }

    #[test]
    fn each_problem_is_named() {
        assert!(problem("{").contains("not valid JSON"));
        assert!(problem("[]").contains("top level must be an object, found an array"));
        assert!(problem("{}").contains("missing field \"processes\""));
        assert!(problem(r#"{"processes":{}}"#).contains("must be an array, found an object"));
        assert!(problem(r#"{"processes":[1]}"#).contains("processes[0] must be an object, found a number"));
        assert!(problem(r#"{"processes":[{"hostname":"h"}]}"#).contains("processes[0]: missing field \"name\""));
        assert!(problem(r#"{"processes":[{"name":"a"}]}"#).contains("missing field \"hostname\""));
        assert!(problem(r#"{"processes":[{"name":"a","hostname":7}]}"#)
            .contains("processes[0].hostname must be a string, found a number"));
        assert!(problem(r#"{"processes":[{"name":"a","hostname":"h","node_id":-1}]}"#)
            .contains("processes[0].node_id must be an integer"));
        assert!(problem(r#"{"processes":[{"name":"a","hostname":"h","node_id":"0"}]}"#)
            .contains("node_id must be an integer"));
        assert!(
            problem(r#"{"processes":[{"name":"a","hostname":"h","node-id":0}]}"#).contains("unknown field \"node-id\"")
        );
        assert!(problem(r#"{"processes":[{"name":"a b","hostname":"h"}]}"#).contains("processes[0].name"));
        assert!(problem(r#"{"processes":[{"name":"a","hostname":"h"},{"name":"a","hostname":"g"}]}"#)
            .contains("described twice"));
    }

    #[test]
    fn file_errors_name_the_file() {
        let err = ProcessConfig::load(Path::new("/nonexistent/lf.json")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Config { .. }));
        assert!(msg.starts_with("config file /nonexistent/lf.json: cannot read it"), "{msg}");
        let err = ProcessConfig::load(Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("is not a regular file"), "{err}");
    }
}
