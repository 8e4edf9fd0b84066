// What the two GPU ping-pong benchmarks share (cuda_ipc_pingpong.cu: plain CUDA IPC;
// lf_cuda_pingpong.cu: lava-flow channels), so that they time the same kernels the same way.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The work of each hop: one side fills the buffer, the other sums it.
__global__ void fill_words(uint32_t *p, size_t words, uint32_t value) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
        p[i] = value;
}

__global__ void sum_words(const uint32_t *p, size_t words, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
        s += p[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0 && s != 0) atomicAdd(out, s);
}

static const unsigned kThreads = 256;

// Waits up to grace_ms for the child, then kills it: the parent must never hang on it.
static int reap(pid_t pid, int grace_ms) {
    int status = 0;
    for (int waited = 0;; waited += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0) return -1;
        if (waited >= grace_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return status;
        }
        usleep(10000);
    }
}

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

struct Stats {
    double p50, p99;
};

static Stats stats(std::vector<double> v) {
    if (v.empty()) return {0, 0};
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return {v[n / 2], v[std::min(n - 1, n * 99 / 100)]};
}

// `--sizes 4096,1048576`: positive multiples of 4 bytes (the kernels work on words).
static std::vector<size_t> parse_sizes(const std::string &list) {
    std::vector<size_t> sizes;
    for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        std::string item = list.substr(at, comma - at);
        char *end = nullptr;
        unsigned long long n = std::strtoull(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || n == 0 || n % 4 != 0) {
            std::fprintf(stderr, "--sizes: '%s' is not a positive multiple of 4 bytes\n", item.c_str());
            std::exit(2);
        }
        sizes.push_back(size_t(n));
        at = comma + 1;
    }
    return sizes;
}
