//! The committed `include/lava_flow.h` must be exactly what cbindgen generates from the sources,
//! and its version macros must match Cargo.toml.
//!
//! To regenerate after changing the C API: `scripts/regen-header.sh`
//! (it runs this test with `LF_BLESS_HEADER=1`).

use std::path::{Path, PathBuf};

/// The repository's root, where cbindgen.toml and include/ are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn generate() -> String {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut out = Vec::new();
    // This crate is the C API alone: cbindgen reads it, not the Rust core.
    cbindgen::Builder::new()
        .with_crate(env!("CARGO_MANIFEST_DIR"))
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn header_is_up_to_date() {
    let path = root().join("include/lava_flow.h");
    let generated = generate();
    if std::env::var_os("LF_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/lava_flow.h is stale (first difference at line {}): run scripts/regen-header.sh and commit it",
            first_diff + 1
        );
    }
}

#[test]
fn header_version_matches_cargo() {
    let header = generate();
    for (macro_name, value) in [
        ("LAVA_FLOW_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("LAVA_FLOW_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("LAVA_FLOW_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        let line = format!("#define {macro_name} {value}");
        assert!(
            header.lines().any(|l| l == line),
            "header lacks `{line}`: update after_includes in cbindgen.toml to match Cargo.toml"
        );
    }
}

/// Every name the header declares is prefixed, so lava-flow cannot collide with a user's
/// symbols; a public Rust item that leaks into the header shows up here.
#[test]
fn every_exported_name_is_prefixed() {
    let header = generate();
    let mut unprefixed = Vec::new();
    for line in header.lines() {
        let name = if let Some(rest) = line.strip_prefix("#define ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("typedef struct ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("enum ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("typedef ").and_then(|r| r.split_once("(*")) {
            // A function pointer type: `typedef void (*name)(...`.
            rest.1.split(')').next()
        } else if !line.starts_with(' ') && !line.starts_with('/') && !line.starts_with('#') && line.contains('(') {
            // A function declaration: the identifier before the first parenthesis.
            line.split('(').next().and_then(|s| s.rsplit([' ', '*']).next())
        } else {
            None
        };
        if let Some(name) = name {
            let ok = name.starts_with("lf_") || name.starts_with("LF_") || name.starts_with("LAVA_FLOW_");
            if !ok {
                unprefixed.push(name.to_owned());
            }
        }
    }
    assert!(unprefixed.is_empty(), "unprefixed names in the header: {unprefixed:?} (make them pub(crate) or add them to [export] exclude in cbindgen.toml)");
}
