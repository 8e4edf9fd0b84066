// A CUDA consumer of a lava-flow channel that carries GPU buffers. The program forks: the
// parent is a lava-flow producer that writes 1 MiB DEVICE_LOCAL buffers and sends them by
// reference (lf_send_buffer), the child a CUDA program that receives them (lf_recv,
// lf_message_buffer), imports each buffer's memory into CUDA (lf_buffer_describe to look its
// arena up, lf_buffer_export + cudaImportExternalMemory once per arena), waits in its stream on the channel's ready
// timeline semaphore where the channel has one, sums the bytes with a kernel and checks the
// sum before it releases the message. Each process makes its own lf_context after the fork.
//
// Built when CMake finds a CUDA compiler and toolkit; prints PASS cuda_consumer when both
// processes succeeded and exits non-zero otherwise.
#include <lava_flow.h>

#include <cuda_runtime.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#define LF_CHECK(call)                                                                            \
    do {                                                                                          \
        lf_status status_ = (call);                                                               \
        if (status_ != LF_OK) {                                                                   \
            std::fprintf(stderr, "FAIL %s: %s: %s\n", #call, lf_status_str(status_),             \
                         lf_last_error_message());                                                \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t error_ = (call);                                                              \
        if (error_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "FAIL %s: %s\n", #call, cudaGetErrorString(error_));             \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

static const size_t kSize = 1u << 20;
static const int kBuffers = 4;
static const int kMessages = 64;
static const int64_t kTimeoutNs = 10LL * 1000 * 1000 * 1000;

static unsigned char pattern(size_t j, int i) { return static_cast<unsigned char>((j * 7 + size_t(i)) & 0xff); }

static unsigned long long expected_sum(int i) {
    unsigned long long sum = 0;
    for (size_t j = 0; j < kSize; j++) sum += pattern(j, i);
    return sum;
}

__global__ void sum_bytes(const unsigned char *data, size_t size, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size; i += size_t(gridDim.x) * blockDim.x)
        s += data[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

// Both ends run on this host; the channel's name carries the parent's pid so that concurrent
// runs do not meet.
static int producer(const char *name) {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    lf_context *context = nullptr;
    LF_CHECK(lf_context_create(&config, &context));
    lf_location *me = nullptr, *peer = nullptr;
    LF_CHECK(lf_location_detect(&me));
    LF_CHECK(lf_location_detect(&peer));
    lf_channel *channel = nullptr;
    LF_CHECK(lf_channel_create(context, name, LF_ROLE_PRODUCER, me, peer, nullptr, &channel));
    const char *transport = nullptr, *why = nullptr;
    LF_CHECK(lf_channel_transport(channel, &transport, &why));
    std::printf("producer: channel %s over %s (%s)\n", name, transport, why);

    lf_buffer *buffers[kBuffers] = {};
    for (int b = 0; b < kBuffers; b++) {
        LF_CHECK(lf_alloc(context, kSize, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffers[b]));
        lf_memory_kind location{};
        LF_CHECK(lf_buffer_location(buffers[b], &location));
        if (location != LF_MEMORY_GPU_DEVICE_LOCAL) {
            std::fprintf(stderr, "FAIL: buffer %d is not device-local memory (location %u)\n", b, location);
            return 1;
        }
    }

    std::vector<unsigned char> host(kSize);
    uint64_t sequences[kMessages] = {};
    for (int i = 0; i < kMessages; i++) {
        lf_buffer *buffer = buffers[i % kBuffers];
        // The consumer may read a buffer until it releases the message that carried it.
        if (i >= kBuffers) LF_CHECK(lf_wait_completed(channel, sequences[i - kBuffers], kTimeoutNs));
        for (size_t j = 0; j < kSize; j++) host[j] = pattern(j, i);
        LF_CHECK(lf_buffer_write(buffer, 0, host.data(), kSize));
        LF_CHECK(lf_send_buffer(channel, buffer, 0, kSize, kTimeoutNs, &sequences[i]));
    }
    for (int i = kMessages - kBuffers; i < kMessages; i++)
        LF_CHECK(lf_wait_completed(channel, sequences[i], kTimeoutNs));
    std::printf("producer: %d messages of %zu bytes sent from %d GPU buffers, all released\n", kMessages, kSize,
                kBuffers);

    lf_channel_free(channel);
    for (lf_buffer *buffer : buffers) lf_free(buffer);
    lf_location_free(peer);
    lf_location_free(me);
    lf_context_free(context);
    return 0;
}

// One CUDA import per arena: a channel sends many buffers of few arenas, and an import costs
// far more than a kernel launch.
struct ArenaImport {
    cudaExternalMemory_t memory;
    unsigned char *base;  // the whole arena, mapped once
    uint64_t size;
};
using ArenaKey = std::tuple<uint32_t, uint64_t, uint64_t>;  // exporter pid, token, arena id

static int consumer(const char *name) {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    lf_context *context = nullptr;
    LF_CHECK(lf_context_create(&config, &context));
    lf_device_info info{};
    info.struct_size = sizeof info;
    LF_CHECK(lf_context_device_info(context, &info));

    // The CUDA device that is this context's Vulkan device: the semaphore and the imported
    // memory live there. Their UUIDs are equal.
    int count = 0, device = -1;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d = 0; d < count && device < 0; d++) {
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, d));
        if (std::memcmp(properties.uuid.bytes, info.device_uuid, 16) == 0) {
            device = d;
            std::printf("consumer: CUDA device %d (%s) is the Vulkan device\n", d, properties.name);
        }
    }
    if (device < 0) {
        std::fprintf(stderr, "FAIL: none of the %d CUDA devices has the Vulkan device's UUID\n", count);
        return 1;
    }
    CUDA_CHECK(cudaSetDevice(device));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned long long *device_sum = nullptr;
    CUDA_CHECK(cudaMalloc(&device_sum, sizeof *device_sum));

    lf_location *me = nullptr, *peer = nullptr;
    LF_CHECK(lf_location_detect(&me));
    LF_CHECK(lf_location_detect(&peer));
    lf_channel *channel = nullptr;
    LF_CHECK(lf_channel_create(context, name, LF_ROLE_CONSUMER, me, peer, nullptr, &channel));

    // How the channel says a buffer is ready: a timeline semaphore to wait on in the stream,
    // or (LF_ERR_UNSUPPORTED) nothing to wait on, the producer's work being done on the host
    // before the message is sent.
    cudaExternalSemaphore_t ready = nullptr;
    int semaphore_fd = -1;
    lf_status route = lf_channel_ready_semaphore(channel, &semaphore_fd);
    if (route == LF_OK) {
        cudaExternalSemaphoreHandleDesc semaphore_desc{};
        semaphore_desc.type = cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd;
        semaphore_desc.handle.fd = semaphore_fd;
        cudaError_t imported = cudaImportExternalSemaphore(&ready, &semaphore_desc);
        if (imported != cudaSuccess) {
            close(semaphore_fd);  // CUDA owns the fd only after a successful import
            std::fprintf(stderr, "FAIL cudaImportExternalSemaphore: %s\n", cudaGetErrorString(imported));
            return 1;
        }
        std::printf("consumer: the channel's ready timeline semaphore is imported into CUDA\n");
    } else if (route == LF_ERR_UNSUPPORTED) {
        std::printf("consumer: the channel synchronises on the host, no semaphore to wait on (%s)\n",
                    lf_last_error_message());
    } else {
        std::fprintf(stderr, "FAIL lf_channel_ready_semaphore: %s: %s\n", lf_status_str(route),
                     lf_last_error_message());
        return 1;
    }

    std::map<ArenaKey, ArenaImport> imports;
    int waits = 0;
    for (int i = 0; i < kMessages; i++) {
        lf_message message{};
        LF_CHECK(lf_recv(channel, kTimeoutNs, &message));
        if (!(message.flags & LF_MESSAGE_GPU) || message.len != kSize || message.sequence != uint64_t(i)) {
            std::fprintf(stderr, "FAIL: message %d: flags %u, %zu bytes, sequence %llu; expected GPU memory, %zu "
                         "bytes, sequence %d\n",
                         i, message.flags, message.len, static_cast<unsigned long long>(message.sequence), kSize, i);
            return 1;
        }
        const lf_buffer *buffer = nullptr;  // borrowed until lf_release: never lf_free it
        LF_CHECK(lf_message_buffer(channel, &message, &buffer));
        // Described (no descriptor made): an arena mapped already is only looked up.
        lf_export exported;
        LF_CHECK(lf_buffer_describe(buffer, &exported));

        ArenaKey key{exported.exporter_pid, exported.exporter_token, exported.arena_id};
        auto found = imports.find(key);
        if (found == imports.end()) {
            LF_CHECK(lf_buffer_export(buffer, &exported));  // the arena's fd, once
            if (std::memcmp(exported.device_uuid, info.device_uuid, 16) != 0) {
                close(exported.fd);
                std::fprintf(stderr, "FAIL: message %d's memory belongs to another GPU\n", i);
                return 1;
            }
            cudaExternalMemoryHandleDesc memory_desc{};
            memory_desc.type = cudaExternalMemoryHandleTypeOpaqueFd;
            memory_desc.handle.fd = exported.fd;
            memory_desc.size = exported.arena_size;  // the whole allocation, not just the buffer
            memory_desc.flags = (exported.gpu_flags & LF_EXPORT_GPU_DEDICATED) ? cudaExternalMemoryDedicated : 0;
            cudaExternalMemory_t memory = nullptr;
            cudaError_t imported = cudaImportExternalMemory(&memory, &memory_desc);
            if (imported != cudaSuccess) {
                close(exported.fd);  // CUDA owns the fd only after a successful import
                std::fprintf(stderr, "FAIL cudaImportExternalMemory: %s\n", cudaGetErrorString(imported));
                return 1;
            }
            // Map the whole arena once; each buffer is then an offset into it.
            cudaExternalMemoryBufferDesc buffer_desc{};
            buffer_desc.offset = 0;
            buffer_desc.size = exported.arena_size;
            void *base = nullptr;
            CUDA_CHECK(cudaExternalMemoryGetMappedBuffer(&base, memory, &buffer_desc));
            found = imports.emplace(key, ArenaImport{memory, static_cast<unsigned char *>(base), exported.arena_size})
                        .first;
            std::printf("consumer: imported arena %llu of process %u into CUDA (%llu bytes, %s)\n",
                        static_cast<unsigned long long>(exported.arena_id), exported.exporter_pid,
                        static_cast<unsigned long long>(exported.arena_size),
                        exported.gpu_flags & LF_EXPORT_GPU_DEDICATED ? "dedicated" : "pooled");
        }
        if (message.len > exported.size || exported.offset + message.len > found->second.size) {
            std::fprintf(stderr, "FAIL: message %d (%zu bytes) lies outside its buffer or arena\n", i, message.len);
            return 1;
        }
        const unsigned char *data = found->second.base + exported.offset;

        // The kernel must not read before the producer's GPU work on the buffer is done.
        if (ready && message.ready_value != 0) {
            cudaExternalSemaphoreWaitParams wait{};
            wait.params.fence.value = message.ready_value;
            CUDA_CHECK(cudaWaitExternalSemaphoresAsync(&ready, &wait, 1, stream));
            waits++;
        }
        CUDA_CHECK(cudaMemsetAsync(device_sum, 0, sizeof *device_sum, stream));
        sum_bytes<<<256, 256, 0, stream>>>(data, message.len, device_sum);
        CUDA_CHECK(cudaGetLastError());
        unsigned long long sum = 0;
        CUDA_CHECK(cudaMemcpyAsync(&sum, device_sum, sizeof sum, cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));  // done with the buffer: it may be released
        unsigned long long want = expected_sum(i);
        if (sum != want) {
            std::fprintf(stderr, "FAIL: message %d sums to %llu on the GPU, expected %llu\n", i, sum, want);
            return 1;
        }
        LF_CHECK(lf_release(channel, &message));
    }
    std::printf("consumer: %d messages summed on the GPU and checked, %d semaphore waits\n", kMessages, waits);
    std::printf("cuda imports: %zu arenas for %d messages\n", imports.size(), kMessages);

    for (auto &entry : imports) {
        CUDA_CHECK(cudaFree(entry.second.base));
        CUDA_CHECK(cudaDestroyExternalMemory(entry.second.memory));
    }
    if (ready) CUDA_CHECK(cudaDestroyExternalSemaphore(ready));
    CUDA_CHECK(cudaFree(device_sum));
    CUDA_CHECK(cudaStreamDestroy(stream));
    lf_channel_free(channel);
    lf_location_free(peer);
    lf_location_free(me);
    lf_context_free(context);
    return 0;
}

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    char name[64];
    std::snprintf(name, sizeof name, "cuda-consumer-%d", int(getpid()));
    std::fflush(stdout);
    // Neither process touches lava-flow, Vulkan or CUDA before the fork: none survives one.
    pid_t child = fork();
    if (child < 0) {
        std::perror("fork");
        return 1;
    }
    if (child == 0) std::exit(consumer(name));

    int produced = producer(name);
    int status = 0;
    if (waitpid(child, &status, 0) != child) {
        std::perror("waitpid");
        return 1;
    }
    bool consumed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (produced != 0 || !consumed) {
        std::fprintf(stderr, "FAIL cuda_consumer: the producer %s, the consumer %s\n",
                     produced == 0 ? "succeeded" : "failed", consumed ? "succeeded" : "failed");
        return 1;
    }
    std::printf("PASS cuda_consumer\n");
    return 0;
}
