//! `-p PEER`: the transports a channel from this process to PEER would take, and why, as the
//! library decides them before a channel's rendezvous (`channels::preview_transports`).

use lava_flow::channels::{preview_transports, ChannelConfig};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::types::explain_scope;
use lava_flow::{ProcessLocation, ProcessName};
use serde_json::{json, Value};

use crate::{text, Failure};

/// PEER as the user gave it: `FILE:NAME` (process NAME of a config file), else a location
/// as `ProcessLocation` reads it (`node7`, `node7,host-id=rack1-7`). Returns the location and
/// where it came from.
fn parse_peer(spec: &str) -> Result<(ProcessLocation, String), Failure> {
    // A hostname has no ':', so one names a config file.
    if let Some((file, name)) = spec.rsplit_once(':') {
        let name =
            ProcessName::new(name).map_err(|e| Failure(format!("peer {spec:?}: the process name after ':': {e}")))?;
        let location = ProcessLocation::from_config(file, &name).map_err(|e| Failure(format!("peer {spec:?}: {e}")))?;
        return Ok((location, format!("process {name} of {file}")));
    }
    let location = spec.parse::<ProcessLocation>().map_err(|e| {
        Failure(format!(
            "peer {spec:?}: {e}. Give a hostname, optionally with numa-node=N, device=N, host-id=ID (`node7,host-id=rack1-7`), \
             or FILE:NAME for a process of a config file"
        ))
    })?;
    Ok((location, "the command line".to_owned()))
}

pub fn view(spec: &str) -> Result<(Value, String), Failure> {
    let (peer, from) = parse_peer(spec)?;
    let mine = ProcessLocation::from_hostname().map_err(|e| Failure(format!("this process's location: {e}")))?;
    // The context an application would have; without a GPU where opening one fails.
    let mut notes = Vec::new();
    let context = match Context::new(ContextConfig::default()) {
        Ok(context) => context,
        Err(e) => {
            notes.push(format!("this process opens no GPU ({e}), so GPU buffers are judged without one"));
            let mut config = ContextConfig::default();
            config.gpu = GpuPolicy::Disabled;
            Context::new(config)?
        }
    };
    let (scope, scope_reason) = explain_scope(&mine, &peer);
    let preview = preview_transports(&mine, &peer, &ChannelConfig::default(), &context);
    let width = text::width();
    let label_w = "messages and CPU payloads".len();
    let indent = 2 + label_w + 2;
    let mut out = String::from("Route to a peer\n\n");
    out.push_str(&text::row(&["this process", &mine.to_string()], &[label_w], width));
    out.push_str(&text::row(&["peer", &format!("{peer} (from {from})")], &[label_w], width));
    out.push_str(&text::row(&["scope", &format!("{scope}: {scope_reason}")], &[label_w], width));
    let routes = match &preview {
        Ok(info) => {
            for route in &info.routes {
                let label = route.class.to_string();
                let label = if label == "CPU payloads" { "messages and CPU payloads".to_owned() } else { label };
                out.push_str(&text::row(&[&label, &format!("{}: {}", route.kind, route.reason)], &[label_w], width));
            }
            info.routes
                .iter()
                .map(|r| json!({ "class": r.class.to_string(), "transport": r.kind.name(), "reason": r.reason }))
                .collect::<Vec<_>>()
        }
        Err(e) => {
            out.push_str(&text::row(
                &["route", &format!("none: a channel to this peer cannot be created: {e}")],
                &[label_w],
                width,
            ));
            Vec::new()
        }
    };
    for note in &notes {
        out.push_str(&text::continuation(&format!("note: {note}"), indent, width));
    }
    let value = json!({
        "this_process": mine.to_string(),
        "peer": peer.to_string(),
        "peer_from": from,
        "scope": scope.to_string(),
        "scope_reason": scope_reason,
        "transports": preview.as_ref().ok().map(|info| info.names()),
        "routes": routes,
        "error": preview.as_ref().err().map(ToString::to_string),
        "notes": notes,
    });
    Ok((value, out))
}
