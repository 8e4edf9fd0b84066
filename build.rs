// Gives the shared library a SONAME, so programs linked against it record `liblava_flow.so`
// (found through their rpath or the loader's path) rather than the build machine's full path.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblava_flow.so");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
