// Both headers compile as strict C++17, twice included; the wrapper turns a failure into an
// lf::Error carrying the status and message, and frees its handles (checked under valgrind).
#include <lava_flow.h>
#include <lava_flow.hpp>
#include <lava_flow.h>
#include <lava_flow.hpp>

#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

static_assert(!std::is_copy_constructible_v<lf::Location>, "handles are move-only");
static_assert(std::is_nothrow_move_constructible_v<lf::Location>, "handles move without throwing");
static_assert(!std::is_copy_constructible_v<lf::Buffer> && !std::is_copy_constructible_v<lf::Export>,
              "buffers and exports are move-only");

// Context, Buffer and Export: allocate, write through the host pointer, export, import the
// same memory again, and see a GPU request fall back visibly (the GPU is disabled here).
static int memory_wrapper() {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    const lf::Context context(&config);
    if (!context.gpu_unavailable_reason()) {
        std::cerr << "a disabled GPU gives no reason\n";
        return 1;
    }
    auto buffer = context.allocate(4096, lf::Memory::CpuStandard);
    std::memcpy(buffer.data(), "lava", 4);
    auto twin = context.import(buffer.export_());
    char seen[5] = {};
    twin.read(0, seen, 4);
    if (std::strcmp(seen, "lava") != 0 || twin.size() != 4096 || twin.location() != lf::Memory::CpuStandard) {
        std::cerr << "the imported buffer is not the same memory\n";
        return 1;
    }
    auto gpu = context.allocate(1 << 16, lf::Memory::GpuDeviceLocal);
    if (gpu.location() != lf::Memory::CpuStandard || !gpu.fallback_reason()) {
        std::cerr << "a GPU request without a GPU did not report its fallback\n";
        return 1;
    }
    try {
        context.allocate(0);
        std::cerr << "size 0 accepted\n";
        return 1;
    } catch (const lf::Error& e) {
        if (e.status() != LF_ERR_INVALID_ARGUMENT) {
            std::cerr << "size 0: wrong status " << e.status() << "\n";
            return 1;
        }
    }
    // The same failure as a value; and a copy between two buffers, each passed as a view.
    auto refused = context.allocate(lf::nothrow, 0);
    if (refused || refused.status() != LF_ERR_INVALID_ARGUMENT || refused.error().message().empty()) {
        std::cerr << "size 0 without exceptions: no error with status and message\n";
        return 1;
    }
    auto copy = context.allocate(lf::nothrow, 4096);
    if (!copy || !context.copy(lf::nothrow, *copy, 8, buffer, 0, 4) || !copy->read(lf::nothrow, 8, seen, 4) ||
        std::strcmp(seen, "lava") != 0) {
        std::cerr << "Context::copy between buffers did not copy\n";
        return 1;
    }
    std::cout << "C++ memory wrapper ok (fallback: " << *gpu.fallback_reason() << ")\n";
    return 0;
}

// Logging: a callback sees the context's creation at debug level; a level outside the set is
// refused; an empty callback gives the records back to stderr.
static int logging_wrapper() {
    std::vector<std::pair<lf::LogLevel, std::string>> seen;
    lf::set_log_level(lf::LogLevel::Debug);
    lf::set_log_callback([&seen](lf::LogLevel level, std::string_view target, std::string_view message) {
        seen.emplace_back(level, std::string(target) + ": " + std::string(message));
    });
    {
        lf_context_config config{};
        lf_context_config_init(&config, sizeof config);
        config.gpu_policy = LF_GPU_DISABLED;
        const lf::Context context(&config);
    }
    lf::set_log_callback(nullptr);
    lf::set_log_level(lf::LogLevel::Warn);
    bool created = false;
    for (const auto& [level, text] : seen) {
        created |= level == lf::LogLevel::Debug && text.find("context created") != std::string::npos;
    }
    if (!created) {
        std::cerr << "the log callback did not see the context's creation (" << seen.size() << " records)\n";
        return 1;
    }
    const auto refused = lf::set_log_level(lf::nothrow, static_cast<lf::LogLevel>(99));
    if (refused.status() != LF_ERR_INVALID_ARGUMENT) {
        std::cerr << "log level 99 was not refused\n";
        return 1;
    }
    std::cout << "C++ logging ok (" << seen.size() << " records)\n";
    return 0;
}

int main() {
    auto a = lf::Location::create("node-a", 0, std::nullopt);
    auto b = lf::Location::create("NODE-A");
    auto moved = std::move(b);
    if (a.scope_to(moved) != lf::Scope::Local || a.node_id() != 0u || moved.device_id().has_value()) {
        std::cerr << "wrong location values\n";
        return 1;
    }
    try {
        lf::Location::create("", std::nullopt, std::nullopt);
        std::cerr << "empty hostname accepted\n";
        return 1;
    } catch (const lf::Error& e) {
        if (e.status() != LF_ERR_INVALID_ARGUMENT || std::strstr(e.what(), "hostname is empty") == nullptr) {
            std::cerr << "wrong error: " << e.status() << " " << e.what() << "\n";
            return 1;
        }
        std::cout << "caught: " << e.what() << "\n";
    }
    if (memory_wrapper() != 0) return 1;
    if (logging_wrapper() != 0) return 1;
    std::cout << "C++ wrapper ok, lava-flow " << lf::version() << "\n";
    return 0;
}
