#!/usr/bin/env bash
# Regenerates include/lava_flow.h from the Rust sources (cbindgen.toml): cbindgen runs once per
# concept (crates/c-api/tests/header.rs lists the sections and their source files).
set -euo pipefail
cd "$(dirname "$0")/.."
LF_BLESS_HEADER=1 cargo test --quiet -p lava-flow-c-api --test header header_is_up_to_date
echo "include/lava_flow.h regenerated"
