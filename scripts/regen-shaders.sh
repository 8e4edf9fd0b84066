#!/usr/bin/env bash
# Recompiles the compute shaders of src/memory/gpu/shaders/ to the SPIR-V the crate embeds
# (include_bytes!). Run it after editing a .comp file and commit the .spv files with it:
# builds and CI have no shader compiler. Needs glslangValidator (Debian/Ubuntu:
# apt-get install glslang-tools); spirv-val (spirv-tools) checks the result where present.
set -euo pipefail
cd "$(dirname "$0")/../src/memory/gpu/shaders"
if ! command -v glslangValidator >/dev/null; then
  echo "glslangValidator not found: install glslang-tools (apt-get install glslang-tools)" >&2
  exit 1
fi
# name, then the preprocessor definitions that make it from copy.comp
build() {
  local out=$1
  shift
  # Vulkan 1.0 SPIR-V: lava-flow runs on Vulkan 1.1 devices and up.
  glslangValidator --quiet -V --target-env vulkan1.0 "$@" -o "$out" copy.comp
  if command -v spirv-val >/dev/null; then
    spirv-val --target-env vulkan1.0 "$out"
  fi
  echo "src/memory/gpu/shaders/$out"
}
build copy_vec4.spv -DELEM=uvec4 -DUNROLL=1
build copy_word.spv -DELEM=uint -DUNROLL=1
