//! `--channels`, `--cleanup`: the channels whose files are in the runtime directory, each
//! alive (a process holds an end) or dead, and the removal of what dead ones left. Whether an
//! end lives is asked of its lock, as the channels themselves ask it
//! (`channels::transports::shm::rendezvous`), so a live channel's files are never removed.

use std::path::PathBuf;

use lava_flow::channels::{channels_in_runtime_dir, remove_leftovers, runtime_dir_path, ChannelFiles};
use lava_flow::env;
use serde_json::{json, Value};

use crate::{text, Failure};

fn to_json(c: &ChannelFiles) -> Value {
    json!({
        "name": c.name,
        "alive": c.is_live(),
        "producer": c.producer.describe(),
        "consumer": c.consumer.describe(),
        "socket": c.socket,
    })
}

/// Where the runtime directory's path comes from, in words.
fn dir_source() -> String {
    if env::setting(&env::RUNTIME_DIR).env_value.is_some() {
        format!("from {}", env::RUNTIME_DIR.name)
    } else if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|x| !x.is_empty() && std::path::Path::new(&x).is_dir()) {
        "$XDG_RUNTIME_DIR/lava-flow".to_owned()
    } else {
        "the default without XDG_RUNTIME_DIR".to_owned()
    }
}

pub fn view(cleanup: bool) -> Result<(Value, String), Failure> {
    let dir = runtime_dir_path();
    let mut out = format!("Channels in the runtime directory {} ({})\n\n", dir.display(), dir_source());
    let mut removed: Vec<PathBuf> = Vec::new();
    if cleanup {
        for channel in channels_in_runtime_dir()?.iter().filter(|c| !c.is_live()) {
            removed.extend(remove_leftovers(&channel.name)?);
        }
        if removed.is_empty() {
            out.push_str("  nothing to clean up: no dead channel left files\n\n");
        }
        for path in &removed {
            out.push_str(&format!("  removed {}\n", path.display()));
        }
        if !removed.is_empty() {
            out.push('\n');
        }
    }
    let channels = channels_in_runtime_dir()?;
    if channels.is_empty() {
        out.push_str("  no channels\n");
    } else {
        let width = text::width();
        let name_w = channels.iter().map(|c| c.name.len()).max().unwrap_or(0).max("CHANNEL".len());
        let end_w = channels
            .iter()
            .flat_map(|c| [c.producer.describe().len(), c.consumer.describe().len()])
            .max()
            .unwrap_or(0)
            .max("PRODUCER".len());
        let widths = [name_w, "alive".len(), end_w, end_w];
        out.push_str(&text::row(&["CHANNEL", "STATE", "PRODUCER", "CONSUMER", "SOCKET"], &widths, width));
        for c in &channels {
            let state = if c.is_live() { "alive" } else { "dead" };
            let socket = if c.socket { "yes" } else { "no" };
            out.push_str(&text::row(
                &[&c.name, state, &c.producer.describe(), &c.consumer.describe(), socket],
                &widths,
                width,
            ));
        }
        let dead = channels.iter().filter(|c| !c.is_live()).count();
        if dead > 0 && !cleanup {
            out.push_str(&format!("\n{dead} dead: `lf-info --cleanup` removes their files.\n"));
        }
    }
    let value = json!({
        "runtime_dir": dir.display().to_string(),
        "channels": channels.iter().map(to_json).collect::<Vec<_>>(),
        "removed": cleanup.then(|| removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()),
    });
    Ok((value, out))
}
