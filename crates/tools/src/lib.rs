//! What lava-flow's tools share beyond the library: the value syntax of their command lines
//! ([`cli`]), so that `--sizes 64K` or `--producers 1,2,4` means the same to every tool.

pub mod cli;
