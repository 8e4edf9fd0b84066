//! Helpers of the property tests that feed every decoder what a buggy or hostile peer could
//! send (ring slots, control records, rendezvous messages, export records, GPU route records,
//! MPI headers and discovery records): random bytes, and valid encodings with bytes changed,
//! cut off or added, so that the cases reach past the magic numbers. Each decoder must answer
//! with a value or an error, never a panic, and what it accepts must hold its invariants.
//!
//! The tests run with the others (`cargo test`), a bounded number of cases each (a few
//! seconds in all); `LF_FUZZ_CASES=N` runs N cases per decoder instead, for longer runs.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The configuration of every fuzzing property: `LF_FUZZ_CASES` cases, else `default`.
pub(crate) fn config(default: u32) -> Config {
    let cases = std::env::var("LF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// `valid` with some bytes overwritten, then perhaps cut short or extended.
pub(crate) fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    (
        prop::collection::vec((0..len.max(1), any::<u8>()), 0..6),
        prop_oneof![Just(None), (0..len.max(1)).prop_map(Some)],
        prop::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(move |(writes, cut, extra)| {
            let mut bytes = valid.clone();
            for (at, byte) in writes {
                if at < bytes.len() {
                    bytes[at] = byte;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            } else {
                bytes.extend(extra);
            }
            bytes
        })
}

/// Random bytes, or `valid` mutated (half the cases each).
pub(crate) fn bytes_near(valid: Vec<u8>, max_len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![prop::collection::vec(any::<u8>(), 0..max_len), mutated(valid)]
}
