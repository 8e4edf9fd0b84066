// lava-flow C++17 wrapper, logging: lf::LogLevel, lf::set_log_level, lf::set_log_callback.
// One part of lava_flow.hpp, which includes them all and says how the wrapper works: include
// that.
#ifndef LAVA_FLOW_LOG_HPP
#define LAVA_FLOW_LOG_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "error.hpp"

namespace lf {

/// The library's runtime version, "MAJOR.MINOR.PATCH".
inline std::string version() { return lf_version(); }

/// lava-flow's log levels: what lf::set_log_level lets through (LF_LOG_LEVEL's values).
enum class LogLevel : std::uint32_t {
    Off = LF_LOG_OFF,
    Error = LF_LOG_ERROR,
    Warn = LF_LOG_WARN,
    Info = LF_LOG_INFO,
    Debug = LF_LOG_DEBUG,
    Trace = LF_LOG_TRACE,
};

/// Receives lava-flow's log records: level, target (the part of lava-flow, such as
/// "lava_flow::channels"), message. The strings are valid only during the call. It may run on
/// lava-flow's own threads and must not call lava-flow; an exception it throws is dropped.
using LogCallback = std::function<void(LogLevel, std::string_view target, std::string_view message)>;

namespace detail {

/// The callback lava-flow calls now, owned here (lf_set_log_callback keeps a pointer to it).
inline std::unique_ptr<LogCallback>& log_callback() {
    static std::unique_ptr<LogCallback> callback;
    return callback;
}

inline std::mutex& log_mutex() {
    static std::mutex mutex;
    return mutex;
}

inline void log_trampoline(void* user_data, lf_log_level level, const char* target, const char* message) noexcept {
    const auto& callback = *static_cast<const LogCallback*>(user_data);
#if LAVA_FLOW_EXCEPTIONS
    try {
        callback(static_cast<LogLevel>(level), target, message);
    } catch (...) {
    }
#else
    callback(static_cast<LogLevel>(level), target, message);
#endif
}

}  // namespace detail

/// Sets which records lava-flow logs, to stderr or the callback (overrides LF_LOG_LEVEL).
inline Expected<void> set_log_level(nothrow_t, LogLevel level) noexcept {
    return detail::done(lf_set_log_level(static_cast<lf_log_level>(level)));
}

/// Sends lava-flow's log records to `callback` instead of stderr; an empty callback restores
/// stderr. When it returns, the previous callback is no longer running (and is destroyed).
inline Expected<void> set_log_callback(nothrow_t, LogCallback callback) noexcept {
    std::lock_guard<std::mutex> lock(detail::log_mutex());
    std::unique_ptr<LogCallback> next;
    if (callback) {
        next.reset(new (std::nothrow) LogCallback(std::move(callback)));
        if (!next) return Error(LF_ERR_OUT_OF_MEMORY, "no memory for the log callback");
    }
    lf_status status = lf_set_log_callback(next ? detail::log_trampoline : nullptr, next.get());
    if (status != LF_OK) return detail::failure(status);
    detail::log_callback() = std::move(next);
    return {};
}

#if LAVA_FLOW_EXCEPTIONS
inline void set_log_level(LogLevel level) { set_log_level(nothrow, level).value(); }
inline void set_log_callback(LogCallback callback) { set_log_callback(nothrow, std::move(callback)).value(); }
#endif

}  // namespace lf

#endif  // LAVA_FLOW_LOG_HPP
