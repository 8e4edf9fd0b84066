// Prints where this process runs, and its scope to processes described in a config file, as
// examples-c/location.c does, through the C++ wrapper.
//
//   lf_location_cpp [config.json] [process-name ...]
//
// Without arguments only this process's location and its scope to itself are printed. The two
// error styles side by side: a failure that ends the program arrives as a thrown lf::Error; a
// process the config file cannot give is an lf::Expected error, reported before going on to
// the next (the exit status is then 1).
#include <iomanip>
#include <iostream>

#include <lava_flow.hpp>

static int fail(const char* what, const lf::Error& e) {
    std::cerr << what << " failed: " << e.status_name() << "\n  " << e.what() << "\n";
    return 1;
}

static void print_location(const char* label, const lf::Location& loc) {
    std::cout << std::left << std::setw(10) << label << " host=" << loc.hostname();
    if (const auto node = loc.node_id()) std::cout << " numa-node=" << *node;
    if (const auto device = loc.device_id()) std::cout << " device=" << *device;
    std::cout << "\n";
}

int main(int argc, char** argv) {
    try {
        if (lf::version().empty()) return 1;
        std::cout << "lava-flow " << lf::version() << " (header " << LAVA_FLOW_VERSION_MAJOR << "."
                  << LAVA_FLOW_VERSION_MINOR << "." << LAVA_FLOW_VERSION_PATCH << ")\n";

        const auto me = lf::Location::detect();
        print_location("this", me);
        std::cout << "scope this -> this: " << lf::to_string(me.scope_to(me)) << "\n";

        int rc = 0;
        for (int i = 2; i < argc; ++i) {
            const auto peer = lf::Location::from_config(lf::nothrow, argv[1], argv[i]);
            if (!peer) {
                rc = fail("lf_location_from_config", peer.error());
                continue;
            }
            print_location(argv[i], *peer);
            std::cout << "scope this -> " << argv[i] << ": " << lf::to_string(me.scope_to(*peer)) << "\n";
        }
        return rc;
    } catch (const lf::Error& e) {
        return fail("lava-flow", e);
    }
}
