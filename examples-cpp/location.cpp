// Prints where this process runs and its scope to the processes of a config file, through the
// C++ wrapper. A bad config file shows how errors arrive: an lf::Error with status and message.
//
//   lf_location_cpp [config.json] [process-name ...]
#include <iostream>

#include <lava_flow.hpp>

int main(int argc, char** argv) {
    try {
        std::cout << "lava-flow " << lf::version() << "\n";
        const auto me = lf::Location::detect();
        std::cout << "this       host=" << me.hostname();
        if (auto node = me.node_id()) std::cout << " numa-node=" << *node;
        std::cout << "\nscope this -> this: " << lf::to_string(me.scope_to(me)) << "\n";

        for (int i = 2; i < argc; ++i) {
            const auto peer = lf::Location::from_config(argv[1], argv[i]);
            std::cout << argv[i] << " host=" << peer.hostname() << "\n"
                      << "scope this -> " << argv[i] << ": " << lf::to_string(me.scope_to(peer)) << "\n";
        }

        try {
            lf::Location::from_config("/nonexistent/processes.json", "trainer");
            std::cerr << "a missing config file was accepted\n";
            return 1;
        } catch (const lf::Error& e) {
            std::cout << "expected error (status " << e.status() << "): " << e.what() << "\n";
        }
    } catch (const lf::Error& e) {
        std::cerr << "lava-flow error " << lf_status_str(e.status()) << ": " << e.what() << "\n";
        return 1;
    }
    return 0;
}
