// Generates the declarations of the C API from include/lava_flow.h: one struct of function
// pointers (`Lib`) filled from the shared library at import, and the types and constants.
// Parsed as C++ so that the status and other enums come out as typed constants.
use std::path::PathBuf;

fn main() {
    let header = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include/lava_flow.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");
    // Headers whose option structs are growable (a `struct_size` first field, filled by
    // `lf_*_config_init`) get `lf_struct_size`; older ones fill configs with
    // `lf_channel_config_default`. The binding goes through whichever the header has.
    println!("cargo:rustc-check-cfg=cfg(lf_struct_size)");
    let text = std::fs::read_to_string(&header).expect("include/lava_flow.h is readable");
    if text.contains("lf_channel_config_init(") {
        println!("cargo:rustc-cfg=lf_struct_size");
    }
    let bindings = bindgen::Builder::default()
        .header(header.to_str().expect("the repository path is UTF-8"))
        .clang_args(["-x", "c++", "-std=c++17"])
        .allowlist_function("lf_.*")
        .allowlist_type("lf_.*")
        .allowlist_var("LF_.*|LAVA_FLOW_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .dynamic_library_name("Lib")
        .dynamic_link_require_all(true)
        .layout_tests(false)
        .derive_default(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen could not read {}: {e}", header.display()));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("lava_flow.rs");
    bindings.write_to_file(&out).expect("writing the bindings");
}
