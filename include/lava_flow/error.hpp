// lava-flow C++17 wrapper, errors and results: lf::Error, lf::nothrow, lf::Expected
// (lf::Result) and lf::version(); the LAVA_FLOW_EXCEPTIONS switch.
// One part of lava_flow.hpp, which includes them all and says how the wrapper works: include
// that.
#ifndef LAVA_FLOW_ERROR_HPP
#define LAVA_FLOW_ERROR_HPP

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "../lava_flow.h"

#ifndef LAVA_FLOW_EXCEPTIONS
#if defined(__cpp_exceptions)
#define LAVA_FLOW_EXCEPTIONS 1
#else
#define LAVA_FLOW_EXCEPTIONS 0
#endif
#endif

namespace lf {

/// A failed lava-flow call: `status()` is the class of failure, `what()` (or `message()`) the
/// detail. Thrown by the throwing forms, held by an Expected in the non-throwing ones.
class Error : public std::runtime_error {
public:
    Error(lf_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    lf_status status() const noexcept { return status_; }
    /// The status's name and meaning, e.g. "LF_ERR_TIMEOUT: timed out".
    const char* status_name() const noexcept { return lf_status_str(status_); }
    /// What went wrong and, where possible, how to fix it: the same text as `what()`.
    std::string message() const { return what(); }

private:
    lf_status status_;
};

/// The tag that picks an operation's non-throwing form: `lf::Location::detect(lf::nothrow)`.
/// `std::nothrow` works too.
using nothrow_t = std::nothrow_t;
inline constexpr nothrow_t nothrow{};

namespace detail {

/// The calling thread's last lava-flow error, for a call that returned `status`.
inline Error failure(lf_status status) { return Error(status, lf_last_error_message()); }

/// What the throwing forms do with an error: throw it, or without exceptions print it and abort.
[[noreturn]] inline void raise(const Error& error) {
#if LAVA_FLOW_EXCEPTIONS
    throw error;
#else
    std::fprintf(stderr, "lava-flow: %s: %s\n", error.status_name(), error.what());
    std::abort();
#endif
}

/// A unique_ptr whose deleter is a C `_free` function.
template <typename T, void (*Free)(T*)>
struct Deleter {
    void operator()(T* p) const noexcept { Free(p); }
};
template <typename T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, Deleter<T, Free>>;

inline std::optional<std::uint32_t> optional_id(std::int64_t id) {
    if (id == LF_UNSET) return std::nullopt;
    return static_cast<std::uint32_t>(id);
}

inline std::int64_t id_or_unset(std::optional<std::uint32_t> id) {
    return id ? static_cast<std::int64_t>(*id) : LF_UNSET;
}

inline std::optional<std::string> optional_string(const char* s) {
    if (s == nullptr) return std::nullopt;
    return std::string(s);
}

/// A NUL-terminated string in a fixed-size C array, read no further than the array.
template <std::size_t N>
std::string bounded_string(const char (&s)[N]) {
    const void* nul = std::memchr(s, '\0', N);
    return std::string(s, nul != nullptr ? static_cast<std::size_t>(static_cast<const char*>(nul) - s) : N);
}

}  // namespace detail

/// The value of an operation, or the lf::Error that it failed with. `has_value()` (or the bool
/// conversion) tells which; `*`/`->` reach the value, `error()` the failure, `status()` is
/// LF_OK or the failure's status. `value()` is the value or, on failure, the throwing form's
/// behaviour (throws the error; without exceptions prints it and aborts).
template <typename T>
class [[nodiscard]] Expected {
    static_assert(!std::is_reference_v<T> && !std::is_same_v<std::decay_t<T>, Error>,
                  "Expected holds a value, or an Error");

public:
    using value_type = T;

    Expected(const T& value) : value_(value) {}
    Expected(T&& value) noexcept(std::is_nothrow_move_constructible_v<T>) : value_(std::move(value)) {}
    Expected(Error error) noexcept : error_(std::move(error)) {}

    bool has_value() const noexcept { return value_.has_value(); }
    explicit operator bool() const noexcept { return has_value(); }
    lf_status status() const noexcept { return error_ ? error_->status() : LF_OK; }

    T& value() & {
        if (!value_) detail::raise(error());
        return *value_;
    }
    const T& value() const& {
        if (!value_) detail::raise(error());
        return *value_;
    }
    T&& value() && {
        if (!value_) detail::raise(error());
        return std::move(*value_);
    }
    /// The value, or `fallback` on failure.
    template <typename U>
    T value_or(U&& fallback) const& {
        return value_ ? *value_ : static_cast<T>(std::forward<U>(fallback));
    }
    template <typename U>
    T value_or(U&& fallback) && {
        return value_ ? std::move(*value_) : static_cast<T>(std::forward<U>(fallback));
    }

    /// The value; only with one (check first).
    T& operator*() & noexcept { return *value_; }
    const T& operator*() const& noexcept { return *value_; }
    T&& operator*() && noexcept { return std::move(*value_); }
    T* operator->() noexcept { return value_.operator->(); }
    const T* operator->() const noexcept { return value_.operator->(); }

    /// The failure; with a value, an Error of status LF_OK and no message.
    const Error& error() const noexcept {
        if (error_) return *error_;
        static const Error none(LF_OK, "");
        return none;
    }

private:
    std::optional<T> value_;
    std::optional<Error> error_;
};

/// The outcome of an operation that returns nothing: success, or the lf::Error it failed with.
template <>
class [[nodiscard]] Expected<void> {
public:
    using value_type = void;

    Expected() noexcept = default;
    Expected(Error error) noexcept : error_(std::move(error)) {}

    bool has_value() const noexcept { return !error_.has_value(); }
    explicit operator bool() const noexcept { return has_value(); }
    lf_status status() const noexcept { return error_ ? error_->status() : LF_OK; }
    /// Nothing on success; on failure the throwing form's behaviour.
    void value() const {
        if (error_) detail::raise(*error_);
    }
    const Error& error() const noexcept {
        if (error_) return *error_;
        static const Error none(LF_OK, "");
        return none;
    }

private:
    std::optional<Error> error_;
};

namespace detail {

/// Success, or the failure of a call that returned `status`.
inline Expected<void> done(lf_status status) {
    if (status != LF_OK) return failure(status);
    return {};
}

}  // namespace detail

/// Result<T> is another name for Expected<T>.
template <typename T>
using Result = Expected<T>;

}  // namespace lf

#endif  // LAVA_FLOW_ERROR_HPP
