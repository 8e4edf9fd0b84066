// Gives the shared library a versioned SONAME, so programs linked against it record
// `liblava_flow.so.<ABI version>` (found through their rpath or the loader's path) rather than
// the build machine's full path, and a release that breaks the ABI is never loaded in place
// of the one a program was linked with. The ABI version is the major version, or `0.<minor>`
// while the major version is 0 (each 0.x release may break the ABI); CMakeLists.txt derives
// the same from Cargo.toml for the installed file names and symlinks.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
        let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets it");
        let abi = if major == "0" { format!("0.{minor}") } else { major };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblava_flow.so.{abi}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
