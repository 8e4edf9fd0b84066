// Both headers compile as strict C++17, twice included; the wrapper turns a failure into an
// lf::Error carrying the status and message, and frees its handles (checked under valgrind).
#include <lava_flow.h>
#include <lava_flow.hpp>
#include <lava_flow.h>
#include <lava_flow.hpp>

#include <cstring>
#include <iostream>
#include <type_traits>

static_assert(!std::is_copy_constructible_v<lf::Location>, "handles are move-only");
static_assert(std::is_nothrow_move_constructible_v<lf::Location>, "handles move without throwing");

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
    std::cout << "C++ wrapper ok, lava-flow " << lf::version() << "\n";
    return 0;
}
