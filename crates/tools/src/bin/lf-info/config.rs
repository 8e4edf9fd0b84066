//! `-c`: every `LF_*` environment variable the library reads (its table, `lava_flow::env`),
//! with the value that applies now, where it came from and its default.

use lava_flow::env::{self, Setting, Source};
use serde_json::{json, Value};

use crate::text;

/// What the library makes of a variable's value here, where that is more than the value
/// itself (a directory, an identity, a count).
fn resolved(setting: &Setting) -> Option<String> {
    let var = setting.var;
    if var.name == env::RUNTIME_DIR.name {
        return Some(lava_flow::channels::runtime_dir_path().display().to_string());
    }
    if var.name == env::HOST_ID.name {
        return Some(match lava_flow::types::detect_host_id() {
            Ok(Some(id)) => id,
            Ok(None) => "none: hostnames are compared".to_owned(),
            Err(e) => format!("error: {e}"),
        });
    }
    if var.name == env::COPY_THREADS.name {
        return Some(lava_flow::memory::copy_threads().to_string());
    }
    None
}

/// Why a variable has no effect in this build, if it has none.
fn inert(setting: &Setting) -> Option<String> {
    let feature = setting.var.feature?;
    // One arm per feature, even where a build without features makes it look like `matches!`.
    #[allow(clippy::match_like_matches_macro)]
    let built = match feature {
        "vulkan" => cfg!(feature = "vulkan"),
        "mpi" => cfg!(feature = "mpi"),
        _ => true,
    };
    (!built).then(|| format!("no effect: this build lacks the cargo feature `{feature}`"))
}

pub fn view() -> (Value, String) {
    let settings = env::settings();
    let width = text::width();
    let name_w = settings.iter().map(|s| s.var.name.len()).max().unwrap_or(0);
    let indent = 2 + name_w + 2;
    let mut out = String::from("Environment (every LF_* variable lava-flow reads)\n\n");
    let mut list = Vec::new();
    for s in &settings {
        let resolved = resolved(s);
        let inert = inert(s);
        let from = match s.source {
            Source::Environment => format!("[environment; default: {}]", s.var.default),
            Source::Default => "[default]".to_owned(),
        };
        out.push_str(&text::row(&[s.var.name, &format!("{}   {from}", s.value())], &[name_w], width));
        if let Some(resolved) = &resolved {
            out.push_str(&text::continuation(&format!("here: {resolved}"), indent, width));
        }
        if let Some(inert) = &inert {
            out.push_str(&text::continuation(inert, indent, width));
        }
        out.push_str(&text::continuation(s.var.meaning, indent, width));
        list.push(json!({
            "name": s.var.name,
            "value": s.value(),
            "env_value": s.env_value,
            "source": s.source.as_str(),
            "default": s.var.default,
            "resolved": resolved,
            "meaning": s.var.meaning,
            "feature": s.var.feature,
            "no_effect": inert,
        }));
    }
    (json!({ "variables": list }), out)
}
