use std::io::Write;

use lava_flow::{detect_scope, CommunicationScope, Error, ProcessLocation, ProcessName};

/// A temporary file holding `text`, removed when dropped.
fn config_file(text: &str) -> tempfile::TempPath {
    let mut file = tempfile::Builder::new().prefix("lf-scope-").suffix(".json").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.into_temp_path()
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
    let twin = ProcessLocation::from_config(&cfg, &ProcessName::new("twin").unwrap()).unwrap();
    let far = ProcessLocation::from_config(&cfg, &ProcessName::new("far").unwrap()).unwrap();
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
        let err = ProcessLocation::from_config(&cfg, &name).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(expected), "{text}: {msg}");
        if !matches!(err, Error::NotFound(_)) {
            assert!(msg.contains(&cfg.display().to_string()), "names the file: {msg}");
        }
    }
    let missing = ProcessLocation::from_config("/no/such/lf.json", &name).unwrap_err();
    assert!(missing.to_string().contains("/no/such/lf.json"), "{missing}");
}
