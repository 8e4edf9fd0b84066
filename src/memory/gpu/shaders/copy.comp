#version 450
// The GPU-to-GPU copy of lava-flow (src/memory/gpu/shader_copy.rs): every invocation moves
// elements of 16 bytes (uvec4; `-DELEM=uint` builds the 4-byte variant for ranges whose
// offsets are congruent mod 4 only) from `src` to `dst`, in a grid-stride loop, so that one
// dispatch of a bounded number of workgroups copies any count. Each pass of the main loop
// loads UNROLL elements, one grid stride apart, before storing them, each warp's accesses
// contiguous. lava-flow builds it with UNROLL 1 and dispatches as many workgroups as the copy
// needs (up to 65535): on the H200 that kept more accesses in flight than fewer workgroups
// with more elements each (see shader_copy.rs).
//
// Compiled to SPIR-V by scripts/regen-shaders.sh (glslangValidator); the .spv files next to
// this one are committed, since builds do not have glslang.
#extension GL_EXT_control_flow_attributes : require

#ifndef ELEM
#define ELEM uvec4
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

// The workgroup size, a specialization constant (256 unless the device allows fewer).
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly restrict buffer Src { ELEM src[]; };
layout(std430, set = 0, binding = 1) writeonly restrict buffer Dst { ELEM dst[]; };

// Where the copy starts in each bound range, and how many elements it moves.
layout(push_constant) uniform Range {
    uint src_first;
    uint dst_first;
    uint count;
} range;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint s = range.src_first;
    uint d = range.dst_first;
    uint n = range.count;
    uint i = gl_GlobalInvocationID.x;
    // (No overflow: counts stay below 2^30 elements, strides below 2^26.)
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        ELEM v[UNROLL];
        [[unroll]] for (uint k = 0; k < UNROLL; k++) {
            v[k] = src[s + i + k * stride];
        }
        [[unroll]] for (uint k = 0; k < UNROLL; k++) {
            dst[d + i + k * stride] = v[k];
        }
    }
    // The last pass: fewer than UNROLL elements left for this invocation.
    for (; i < n; i += stride) {
        dst[d + i] = src[s + i];
    }
}
