//! What the fan-in and fan-out benchmarks share: the wait strategies their options name, and
//! how their processes spread over the machine's cores, in words.

/// The wait strategy of a fan-out's lava-flow rows (`--wait`), where not the default one.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Busy-poll
    Busy,
    /// Spin, then block
    Spin,
    /// Block
    Block,
}

/// How the processes share `cores`: the `one` process (the fan-in's consumer, the fan-out's
/// producer) on core 0, up to the most of `counts` of the `many` (producers, consumers) each
/// where `core_of(i, cores)` puts it; `pin` false: the kernel places them.
pub fn layout(
    pin: bool,
    cores: usize,
    counts: &[usize],
    (one, many): (&str, &str),
    core_of: fn(usize, usize) -> usize,
) -> String {
    if !pin {
        return format!("{cores} cores allowed; no pinning (--no-pin): the kernel places the {one} and the {many}s");
    }
    let most = counts.iter().copied().max().unwrap_or(1);
    let mut per_core = std::collections::BTreeMap::<usize, usize>::new();
    for i in 0..most {
        *per_core.entry(core_of(i, cores)).or_default() += 1;
    }
    let busiest = per_core.values().copied().max().unwrap_or(0);
    let shared = if busiest > 1 {
        format!("with {most} {many}s, up to {busiest} share a core (oversubscribed: they take turns)")
    } else {
        format!("with {most} {many}s, each has a core of its own")
    };
    let placed = match cores {
        0..=2 => format!("the {many}s all on core 1"),
        _ => format!("{many} i on core 1 + i mod {}", cores - 1),
    };
    format!(
        "{cores} cores allowed: the {one} on core 0, {placed}; {shared}; the peers' processes are placed the same way"
    )
}
