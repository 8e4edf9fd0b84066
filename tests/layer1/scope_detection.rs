use std::io::Write;

use lava_flow::{detect_scope, CommunicationScope, Error, ProcessLocation, ProcessName};

fn config_file(text: &str) -> tempfile_path::TempPath {
    tempfile_path::write(text)
}

/// A tiny temp-file helper, so the tests need no extra crate.
mod tempfile_path {
    use super::*;
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    pub fn write(text: &str) -> TempPath {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("lf-scope-{}-{n}.json", std::process::id()));
        std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
        TempPath(path)
    }
}

#[test]
fn config_peers_are_local_or_remote_to_this_process() {
    let me = ProcessLocation::from_hostname().unwrap();
    let cfg = config_file(&format!(
        r#"{{"processes": [
            {{"name": "twin", "hostname": "{}", "node_id": 0}},
            {{"name": "far", "hostname": "surely-not-{}", "device_id": 1}}
        ]}}"#,
        me.hostname.to_uppercase(),
        me.hostname
    ));
    let twin = ProcessLocation::from_config(&cfg.0, &ProcessName::new("twin").unwrap()).unwrap();
    let far = ProcessLocation::from_config(&cfg.0, &ProcessName::new("far").unwrap()).unwrap();
    assert_eq!(detect_scope(&me, &twin), CommunicationScope::Local);
    assert_eq!(detect_scope(&me, &far), CommunicationScope::Remote);
    assert_eq!(far.device_id, Some(1));
}

#[test]
fn bad_config_files_name_the_file_and_the_problem() {
    let name = ProcessName::new("p").unwrap();
    let cases = [
        ("{ not json", "is not valid JSON"),
        (r#"{"processes": [{"name": "p"}]}"#, "processes[0]: missing field \"hostname\""),
        (r#"{"processes": [{"name": "p", "hostname": ["h"]}]}"#, "hostname must be a string, found an array"),
        (r#"{"processes": [{"name": "q", "hostname": "h"}]}"#, "no process named \"p\""),
    ];
    for (text, expected) in cases {
        let cfg = config_file(text);
        let err = ProcessLocation::from_config(&cfg.0, &name).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(expected), "{text}: {msg}");
        if !matches!(err, Error::NotFound(_)) {
            assert!(msg.contains(&cfg.0.display().to_string()), "names the file: {msg}");
        }
    }
    let missing = ProcessLocation::from_config("/no/such/lf.json", &name).unwrap_err();
    assert!(missing.to_string().contains("/no/such/lf.json"), "{missing}");
}
