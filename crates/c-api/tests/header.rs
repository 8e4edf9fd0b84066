//! The committed `include/lava_flow.h` must be exactly what cbindgen generates from the sources,
//! in concept order, and its version macros must match Cargo.toml.
//!
//! To regenerate after changing the C API: `scripts/regen-header.sh`
//! (it runs this test with `LF_BLESS_HEADER=1`).
//!
//! cbindgen writes a crate's constants, then its types, then its functions. The header reads
//! by concept instead: cbindgen runs once per section, on the source files of that concept,
//! and the sections are joined under one include guard. The opaque handle types are gathered
//! in a section of their own near the top, so that every section may name any handle.

use std::path::{Path, PathBuf};

/// The repository's root, where cbindgen.toml and include/ are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The header's sections in order: title, what the section is about, and the files of
/// `crates/c-api/src` whose items it declares. The handles section has no files: it gathers
/// every section's opaque types.
const SECTIONS: &[(&str, &str, &[&str])] = &[
    ("Status and errors", "Every fallible function's result, and the message that says why it failed.", &["status.rs"]),
    ("Handles", "The objects of the API, opaque: created and freed by lava-flow's functions.", &[]),
    ("Logging", "Where lava-flow's log records go, and which it lets through.", &["logging.rs"]),
    (
        "Context",
        "The per-process memory context, its settings, and the GPU device it opens.",
        &["context.rs", "device.rs"],
    ),
    (
        "Memory",
        "Kinds of memory, allocation, registration of user memory, buffers and their data.",
        &["alloc.rs", "buffer.rs", "buffer_io.rs"],
    ),
    ("Export and import", "A buffer handed to another process on this host, and taken in there.", &["export.rs"]),
    (
        "Channels",
        "Messages from one producer to one consumer: copies, loans, buffers by reference.",
        &["channel_config.rs", "channel.rs", "send.rs", "receive.rs", "peers.rs"],
    ),
    ("Location and scope", "Where a process runs, and whether two processes share a host.", &["location.rs"]),
    ("MPI", "Processes on several hosts, found and named through the application's MPI.", &["mpi.rs"]),
];

const RULE: &str = "// ============================================================================================";

/// The lines that open section `title`.
fn banner(title: &str, about: &str) -> String {
    format!("{RULE}\n// {title}\n//\n// {about}\n{RULE}")
}

fn cbindgen_config() -> cbindgen::Config {
    cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml parses")
}

/// One section's declarations as cbindgen writes them, without the file's frame.
fn section_body(files: &[&str]) -> String {
    let mut config = cbindgen_config();
    config.header = None;
    config.trailer = None;
    config.include_guard = None;
    config.after_includes = None;
    config.autogen_warning = None;
    config.sys_includes = Vec::new();
    config.no_includes = true;
    let mut builder = cbindgen::Builder::new().with_config(config);
    for file in files {
        builder = builder.with_src(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file));
    }
    let mut out = Vec::new();
    builder.generate().expect("cbindgen generates the section").write(&mut out);
    String::from_utf8(out).expect("header is UTF-8").trim().to_owned()
}

/// Splits declarations into blocks (a declaration with its comment), at blank lines.
fn blocks(body: &str) -> Vec<String> {
    body.split("\n\n").map(str::trim).filter(|b| !b.is_empty()).map(str::to_owned).collect()
}

/// Whether a block declares an opaque type (`typedef struct lf_x lf_x;`).
fn is_opaque(block: &str) -> bool {
    let last = block.lines().last().unwrap_or_default();
    last.strip_prefix("typedef struct ")
        .and_then(|rest| rest.strip_suffix(';'))
        .is_some_and(|rest| rest.split_once(' ').is_some_and(|(a, b)| a == b))
}

fn generate() -> String {
    let config = cbindgen_config();
    let mut bodies: Vec<Vec<String>> = SECTIONS.iter().map(|(_, _, files)| blocks(&section_body(files))).collect();
    let mut handles = Vec::new();
    for body in &mut bodies {
        handles.extend(body.iter().filter(|b| is_opaque(b)).cloned());
        body.retain(|b| !is_opaque(b));
    }
    let guard = config.include_guard.as_deref().expect("cbindgen.toml sets include_guard");
    let mut out = String::new();
    if let Some(header) = &config.header {
        out.push_str(header);
        out.push_str("\n\n");
    }
    out.push_str(&format!("#ifndef {guard}\n#define {guard}\n\n"));
    for include in &config.sys_includes {
        out.push_str(&format!("#include <{include}>\n"));
    }
    if let Some(after) = &config.after_includes {
        out.push_str(after);
        out.push('\n');
    }
    for ((title, about, _), body) in SECTIONS.iter().zip(bodies) {
        let body = if *title == "Handles" { std::mem::take(&mut handles) } else { body };
        out.push_str(&format!("\n{}\n\n{}\n", banner(title, about), body.join("\n\n")));
    }
    out.push_str(&format!("\n#endif  /* {guard} */\n"));
    out
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

/// The sections come in concept order, each once, and every source file with exported
/// functions belongs to one (a new file must be given its place in `SECTIONS`).
#[test]
fn sections_are_in_concept_order_and_cover_every_file() {
    let header = generate();
    let mut last = 0;
    for (title, about, _) in SECTIONS {
        let banner = banner(title, about);
        let at = header.find(&banner).unwrap_or_else(|| panic!("section {title} is missing"));
        assert!(at > last || last == 0, "section {title} is out of order");
        assert_eq!(header.matches(&banner).count(), 1, "section {title} appears twice");
        last = at;
    }
    let order: Vec<&str> = SECTIONS.iter().map(|(t, _, _)| *t).collect();
    assert_eq!(
        order,
        [
            "Status and errors",
            "Handles",
            "Logging",
            "Context",
            "Memory",
            "Export and import",
            "Channels",
            "Location and scope",
            "MPI"
        ]
    );
    let listed: Vec<&str> = SECTIONS.iter().flat_map(|(_, _, files)| files.iter().copied()).collect();
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // cbindgen skips the tests.
        let text = text.split("#[cfg(test)]").next().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let declares_c =
            text.lines().map(str::trim_start).any(|l| l.starts_with("#[no_mangle]") || l.starts_with("#[repr("));
        if declares_c {
            assert!(listed.contains(&name.as_str()), "{name} declares C items but is in no section of the header");
        }
    }
    // Each declaration is where its concept is: a few spot checks.
    let section_of = |needle: &str| {
        let at = header.find(needle).unwrap_or_else(|| panic!("{needle} is not in the header"));
        SECTIONS.iter().rev().find(|(t, a, _)| header.find(&banner(t, a)).unwrap() < at).unwrap().0
    };
    assert_eq!(section_of("enum lf_memory_kind"), "Memory");
    assert_eq!(section_of("lf_status lf_alloc("), "Memory");
    assert_eq!(section_of("typedef struct lf_location lf_location;"), "Handles");
    assert_eq!(section_of("typedef struct lf_channel_config {"), "Channels");
    assert_eq!(section_of("enum lf_hugepage_policy"), "Context");
    assert_eq!(section_of("lf_status lf_mpi_join("), "MPI");
}
