// A complete minimal channel in C++: run `minimal_channel_cpp consumer` and
// `minimal_channel_cpp producer` as two processes on one host (either may start first).
#include <lava_flow.hpp>

#include <iostream>
#include <string>
#include <string_view>

int main(int argc, char** argv) try {
    const bool producer = argc > 1 && std::string_view(argv[1]) == "producer";
    const lf::Context context;  // one per process
    if (producer) {
        lf::Producer out(context, "minimal-cpp");  // the consumer is on this host
        for (int i = 0; i < 3; ++i) {
            const std::string text = "message " + std::to_string(i);
            out.send(text.data(), text.size());  // copied into shared memory
        }
    } else {
        lf::Consumer in(context, "minimal-cpp");
        for (int i = 0; i < 3; ++i) {
            const lf::Message m = in.recv();  // a view into shared memory, released at scope end
            std::cout << "received \"" << std::string_view(static_cast<const char*>(m.data()), m.size())
                      << "\"\n";
        }
    }
    return 0;
} catch (const lf::Error& e) {  // status() and what(): what went wrong and how to fix it
    std::cerr << e.what() << '\n';
    return 1;
}
