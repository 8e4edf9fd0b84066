//! `--channels`, `--cleanup`: the channels whose files are in the runtime directory, each
//! alive (a process holds an end) or dead, its kind (a pair; a fan-in, producers in slots; a
//! fan-out, consumers in slots) and each end with its state and pid, and the removal of what dead ones left. Whether an end
//! lives is asked of its lock, as the channels themselves ask it
//! (`channels::transports::shm::rendezvous`), so a live channel's files are never removed.

use std::path::PathBuf;

use lava_flow::channels::{channels_in_runtime_dir, remove_leftovers, runtime_dir_path, ChannelFiles, EndState};
use lava_flow::env;
use serde_json::{json, Value};

use crate::{text, Failure};

/// A channel with fan-in producer locks is a fan-in: a pair's producer holds `<name>.producer.lock`,
/// a fan-in's producers `<name>.producer.<slot>.lock`.
fn is_fan_in(c: &ChannelFiles) -> bool {
    !c.fan_in_producers.is_empty()
}

fn kind(c: &ChannelFiles) -> &'static str {
    if is_fan_in(c) {
        "fan-in"
    } else if c.is_fan_out() {
        "fan-out"
    } else {
        "pair"
    }
}

/// An end's state as a word, and its pid where a process holds it.
fn state_json(state: EndState) -> Value {
    match state {
        EndState::Absent => json!({ "state": "absent", "pid": null }),
        EndState::Live { pid } => json!({ "state": "live", "pid": (pid != 0).then_some(pid) }),
        EndState::Over => json!({ "state": "over", "pid": null }),
    }
}

/// One end in a slot: its slot, state, pid (where a process holds it) and the state in words.
fn slot_json(slot: u32, state: EndState) -> Value {
    let mut v = state_json(state);
    v["slot"] = json!(slot);
    v["describe"] = json!(state.describe());
    v
}

fn to_json(c: &ChannelFiles) -> Value {
    // A pair's one producer is slot 0 (as `Message::producer` says), listed where its lock is.
    let producers: Vec<Value> = if is_fan_in(c) {
        c.fan_in_producers.iter().map(|&(slot, state)| slot_json(slot, state)).collect()
    } else if c.producer != EndState::Absent {
        vec![slot_json(0, c.producer)]
    } else {
        Vec::new()
    };
    let live = |s: &EndState| matches!(s, EndState::Live { .. });
    // A fan-out's producer holds the consumers' socket: its consumers are those in slots.
    let consumers: Vec<Value> = if c.is_fan_out() {
        c.fan_out_consumers.iter().map(|&(slot, state)| slot_json(slot, state)).collect()
    } else if c.consumer != EndState::Absent {
        vec![slot_json(0, c.consumer)]
    } else {
        Vec::new()
    };
    json!({
        "name": c.name,
        "kind": kind(c),
        "alive": c.is_live(),
        "producer": producer_cell(c),
        "consumer": consumer_cell(c),
        "consumer_end": state_json(c.consumer),
        "producers": producers,
        "producers_live": c.fan_in_producers.iter().filter(|(_, s)| live(s)).count() + usize::from(live(&c.producer)),
        "consumers": consumers,
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

/// The PRODUCER column: a pair's one producer; a fan-in's live and total slots (each slot is
/// on a line of its own under the channel).
fn producer_cell(c: &ChannelFiles) -> String {
    if !is_fan_in(c) {
        return c.producer.describe();
    }
    slots_cell(&c.fan_in_producers)
}

/// The CONSUMER column: a pair's or fan-in's one consumer; a fan-out's live and total slots.
fn consumer_cell(c: &ChannelFiles) -> String {
    if !c.is_fan_out() {
        return c.consumer.describe();
    }
    slots_cell(&c.fan_out_consumers)
}

fn slots_cell(slots: &[(u32, EndState)]) -> String {
    let live = slots.iter().filter(|(_, s)| matches!(s, EndState::Live { .. })).count();
    format!("{live} of {} slots live", slots.len())
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
            .flat_map(|c| [producer_cell(c).len(), consumer_cell(c).len()])
            .max()
            .unwrap_or(0)
            .max("PRODUCER".len());
        let widths = [name_w, "fan-out".len(), "alive".len(), end_w, end_w];
        out.push_str(&text::row(&["CHANNEL", "KIND", "STATE", "PRODUCER", "CONSUMER", "SOCKET"], &widths, width));
        for c in &channels {
            let state = if c.is_live() { "alive" } else { "dead" };
            let socket = if c.socket { "yes" } else { "no" };
            out.push_str(&text::row(
                &[&c.name, kind(c), state, &producer_cell(c), &consumer_cell(c), socket],
                &widths,
                width,
            ));
            for (slot, end) in &c.fan_in_producers {
                out.push_str(&text::row(&["", "", "", &format!("slot {slot}: {}", end.describe())], &widths, width));
            }
            if c.is_fan_out() {
                for (slot, end) in &c.fan_out_consumers {
                    let cell = format!("slot {slot}: {}", end.describe());
                    out.push_str(&text::row(&["", "", "", "", &cell], &widths, width));
                }
            }
        }
        let dead = channels.iter().filter(|c| !c.is_live()).count();
        if dead > 0 && !cleanup {
            out.push_str(&format!("\n{dead} dead: `lf-info --cleanup` removes their files.\n"));
        }
        let over_slots = channels
            .iter()
            .filter(|c| c.is_live())
            .any(|c| c.fan_in_producers.iter().chain(&c.fan_out_consumers).any(|(_, s)| *s == EndState::Over));
        if over_slots {
            out.push_str(
                "\nA live channel's over slots are its own to clean up: a fan-in's consumer removes each producer's \
                 lock file once it has reported that producer's end, a fan-out's producer each consumer's once it \
                 has dropped it (or when either closes); `--cleanup` leaves live channels alone.\n",
            );
        }
    }
    let value = json!({
        "runtime_dir": dir.display().to_string(),
        "channels": channels.iter().map(to_json).collect::<Vec<_>>(),
        "removed": cleanup.then(|| removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()),
    });
    Ok((value, out))
}
