// lava-flow C++17 wrapper: header-only, built on the C API in lava_flow.h alone.
//
// - Handles are move-only RAII types; their destructors call the C `_free` functions. A
//   received lf::Message is released, and an unpublished lf::Loan given back, by its destructor.
// - Every operation comes in two forms:
//     * with `lf::nothrow` as its first argument, it returns an lf::Expected<T>: the value, or an
//       lf::Error carrying the lf_status and lava-flow's message. It never throws, and it is all
//       there is when exceptions are off;
//     * without, it returns T and throws the lf::Error (a thin layer over the first form).
//   Objects made by a throwing constructor (Context, Producer, Consumer) are made by
//   `create(lf::nothrow, ...)` in the non-throwing form.
// - Without exceptions (-fno-exceptions, or LAVA_FLOW_EXCEPTIONS defined to 0 before the
//   include) the throwing forms are not declared, so code that relies on them does not compile;
//   Expected::value() of an error prints the status and message to stderr and aborts. Use one
//   setting across a program.
// - A channel end, and the messages and loans it hands out, are used from one thread at a time.
// - Everything is in namespace `lf`.
//
// The wrapper is in parts, one per concept (include/lava_flow/), all included here.
#ifndef LAVA_FLOW_HPP
#define LAVA_FLOW_HPP

#include "lava_flow/error.hpp"
#include "lava_flow/log.hpp"
#include "lava_flow/location.hpp"
#include "lava_flow/memory.hpp"
#include "lava_flow/channel.hpp"

#endif  // LAVA_FLOW_HPP
