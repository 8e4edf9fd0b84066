//! The values the tools' command lines take, as clap value parsers: sizes (`64`, `4K`, `1M`,
//! `1G`, or `4KiB`, any case), lists of values separated by [`LIST`] (`--sizes 8,64,1K`,
//! `--producers 1,2,4,8`: clap splits them, each entry through the element's parser), counts
//! with a ceiling, and seconds. A tool names a parser in its `#[arg(value_parser = ...)]`;
//! clap then refuses a bad value naming the option and the value, and exits with status 2.

use std::fmt::Display;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Command, CommandFactory, FromArgMatches};

/// What separates a list's entries.
pub const LIST: char = ',';

/// Suffixes of sizes, longest first, with the power of two each multiplies by.
const UNITS: [(&str, u32); 6] = [("kib", 10), ("mib", 20), ("gib", 30), ("k", 10), ("m", 20), ("g", 30)];

/// A size in bytes: digits, optionally with `K`, `M` or `G` (binary: `1K` is 1024 bytes) or
/// `KiB`, `MiB`, `GiB`, in any case. `0` is a size: a tool that takes it to mean "none" says so.
pub fn size(text: &str) -> Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (digits, shift) =
        UNITS.iter().find_map(|&(unit, shift)| lower.strip_suffix(unit).map(|d| (d, shift))).unwrap_or((&lower, 0));
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size: give bytes, like 64, 4K, 1M or 1G (K = 1024)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is more bytes than this machine can address"))
}

/// A size of at least one byte (see [`size`]).
pub fn nonzero_size(text: &str) -> Result<usize, String> {
    match size(text)? {
        0 => Err(format!("{text:?} is no size for a message or a copy: give at least 1 byte")),
        n => Ok(n),
    }
}

/// A count from 1 to `most`, as a value parser: `--producers 1,2,4,8` up to a fan-in's peers.
pub fn count_up_to(most: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text: &str| match text.trim().parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is out of range: give 1 to {most}")),
        Err(_) => Err(format!("{text:?} is not a count: give a whole number from 1 to {most}")),
    }
}

/// A whole number, 1 or more: round trips, rounds, messages in a window.
pub fn positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{text:?} is not a count: give a whole number, 1 or more")),
    }
}

/// Seconds, more than 0 and less than 600, fractions allowed (`0.5`).
pub fn seconds(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s < 600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{text:?} is not a duration: give seconds above 0 and below 600, like 0.5"))
}

/// `C`'s command as every tool shows it: help text wrapped at 100 columns at most, and an
/// option given twice taking its last value (as the hand-written parsers before clap did, so
/// that a script may add to a command line that already names an option).
pub fn command<C: CommandFactory>() -> Command {
    C::command().max_term_width(100).args_override_self(true)
}

/// This process's command line parsed into `C` ([`command`]'s settings); on `--help` the help
/// and exit status 0, on a mistake clap's message naming it and exit status 2.
pub fn parse<C: CommandFactory + FromArgMatches>() -> C {
    let mut command = command::<C>();
    let matches = command.get_matches_mut();
    C::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command).exit())
}

/// Ends the process as clap does for a value it refuses (the message, the usage, exit status
/// 2), for what only the options together can refuse: a pair that needs each other, a value
/// out of the range another setting allows.
pub fn refuse<C: CommandFactory>(message: impl Display) -> ! {
    command::<C>().error(ErrorKind::ValueValidation, message).exit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units_in_any_case() {
        assert_eq!(size("8"), Ok(8));
        assert_eq!(size("0"), Ok(0));
        assert_eq!(size("4K"), Ok(4096));
        assert_eq!(size("64k"), Ok(64 << 10));
        assert_eq!(size("1M"), Ok(1 << 20));
        assert_eq!(size("256MiB"), Ok(256 << 20));
        assert_eq!(size("1g"), Ok(1 << 30));
        assert_eq!(size(" 2G "), Ok(2 << 30));
        assert!(size("x").unwrap_err().contains("\"x\" is not a size"));
        assert!(size("1T").is_err() && size("K").is_err() && size("-1").is_err() && size("").is_err());
        assert!(size(&format!("{}G", usize::MAX)).unwrap_err().contains("more bytes"));
        assert!(nonzero_size("0").unwrap_err().contains("at least 1 byte"));
        assert_eq!(nonzero_size("64"), Ok(64));
    }

    #[test]
    fn counts_have_a_floor_and_a_ceiling() {
        let peers = count_up_to(8);
        assert_eq!(peers("1"), Ok(1));
        assert_eq!(peers("8"), Ok(8));
        assert!(peers("0").unwrap_err().contains("1 to 8"));
        assert!(peers("9").unwrap_err().contains("9 is out of range"));
        assert!(peers("two").unwrap_err().contains("not a count"));
        assert_eq!(positive("200"), Ok(200));
        assert!(positive("0").unwrap_err().contains("1 or more") && positive("-3").is_err());
    }

    /// Two list options as the tools declare them (`ArgAction::Set`: a list is one value, split).
    #[derive(clap::Parser, Debug)]
    struct Lists {
        #[arg(long, value_delimiter = LIST, action = clap::ArgAction::Set, value_parser = nonzero_size)]
        sizes: Vec<usize>,
        #[arg(long, value_delimiter = LIST, action = clap::ArgAction::Set, value_parser = count_up_to(8))]
        producers: Vec<usize>,
    }

    #[test]
    fn lists_split_at_commas_and_a_bad_entry_is_named() {
        let parse =
            |args: &[&str]| command::<Lists>().try_get_matches_from(args).and_then(|m| Lists::from_arg_matches(&m));
        let lists = parse(&["t", "--sizes", "8,64K,1M", "--producers", "1,2,4,8"]).expect("parses");
        assert_eq!(lists.sizes, [8, 64 << 10, 1 << 20]);
        assert_eq!(lists.producers, [1, 2, 4, 8]);
        let last = parse(&["t", "--sizes", "8,64", "--sizes", "4K"]).expect("parses");
        assert_eq!(last.sizes, [4096], "a repeated option replaces its list, as the hand-written parsers did");
        let bad = parse(&["t", "--sizes", "8,4X"]).unwrap_err();
        assert_eq!((bad.kind(), bad.exit_code()), (ErrorKind::ValueValidation, 2));
        let text = bad.to_string();
        assert!(text.contains("--sizes") && text.contains("\"4X\" is not a size"), "{text}");
        let bad = parse(&["t", "--producers", "1,9"]).unwrap_err().to_string();
        assert!(bad.contains("--producers") && bad.contains("9 is out of range"), "{bad}");
    }

    #[test]
    fn seconds_are_positive_and_bounded() {
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("2"), Ok(Duration::from_secs(2)));
        for bad in ["0", "-1", "600", "soon", "NaN"] {
            assert!(seconds(bad).unwrap_err().contains("give seconds"), "{bad}");
        }
    }
}
