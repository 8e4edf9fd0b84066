/* Vulkan -> OpenGL interop through a lava-flow channel: a producer process writes two frames
 * into a DEVICE_LOCAL lava-flow buffer and sends the second by reference (lf_send_buffer); the
 * consumer process receives it (lf_recv, lf_message_buffer), exports the message's buffer
 * (lf_buffer_export) and imports that memory into OpenGL with GL_EXT_memory_object_fd
 * (glImportMemoryFdEXT, glBufferStorageMemEXT; the frame lies at the export's offset), in a
 * headless EGL context on the Vulkan device's GPU (EGL_EXT_platform_device, or
 * EGL_MESA_platform_surfaceless; no window, no pbuffer). OpenGL reads the frame and checks
 * every byte, then writes its own bytes over it with a copy on the GPU; the producer, once the
 * consumer released the message, reads OpenGL's bytes through lava-flow (and finds its first
 * frame untouched).
 *
 * Synchronisation is on the host. lava-flow's channel semaphores are Vulkan timeline
 * semaphores, and GL_EXT_semaphore_fd imports binary ones only, so OpenGL cannot wait for them
 * (NVIDIA's GL_NV_timeline_semaphore could, for a producer whose own GPU work signals the
 * channel's ready semaphore: lf_send_buffer_after). Here the producer's bytes are in place when
 * it sends (lava-flow's own writes are), so the frame is ready when it is received; and the
 * consumer finishes its OpenGL work (glFinish) before it releases the message, after which the
 * producer may read or rewrite the frame.
 *
 *   opengl_import                  the consumer here; it starts the producer as a second process
 *   opengl_import producer NAME    the producer of channel NAME alone
 *
 * Exits 77 (ctest: skipped), saying what is missing, where there is no Vulkan device, no EGL
 * display with an OpenGL context on that device, no GL_EXT_memory_object_fd there, or where the
 * channel stages GPU buffers through host memory instead of sending them by reference;
 * non-zero on any failure. Mesa's llvmpipe offers the extension on the CPU (and its memory is
 * lavapipe's), NVIDIA's driver on its GPUs. */
#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GL/gl.h>
#include <GL/glext.h>

#include <lava_flow.h>

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP 77

extern char **environ;

/* Each frame is an odd size so that the second one, the frame sent, starts inside the arena
 * at an offset that no page or alignment rounding hides. */
static const size_t kFrame = (1u << 20) + 7;
static const int64_t kTimeoutNs = 30LL * 1000 * 1000 * 1000;

static int lf_fail(const char *call, lf_status status) {
    fprintf(stderr, "FAIL %s: %s: %s\n", call, lf_status_str(status), lf_last_error_message());
    return 1;
}
#define LF_CHECK(call) do { lf_status s_ = (call); if (s_ != LF_OK) return lf_fail(#call, s_); } while (0)

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 13u + seed * 101u); }

static int holds(const char *who, const unsigned char *bytes, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (bytes[i] != pattern(i, seed)) {
            fprintf(stderr, "%s: byte %zu is %u, expected %u\n", who, i, bytes[i], pattern(i, seed));
            return 0;
        }
    return 1;
}

/* ---- The producer: lava-flow only. ---------------------------------------------------- */

enum { kFirstFrameSeed = 1, kSentFrameSeed = 2, kGlSeed = 3 };

static int producer(const char *name) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    lf_context *context = NULL;
    LF_CHECK(lf_context_create(&config, &context));
    lf_location *here = NULL;
    LF_CHECK(lf_location_detect(&here));
    lf_channel *channel = NULL;
    LF_CHECK(lf_channel_create(context, name, LF_ROLE_PRODUCER, here, here, NULL, &channel));
    const char *transport = NULL;
    LF_CHECK(lf_channel_transport(channel, &transport, NULL));

    lf_buffer *frames = NULL;
    LF_CHECK(lf_alloc(context, 2 * kFrame, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &frames));
    unsigned char *bytes = malloc(2 * kFrame);
    if (!bytes) return 1;
    for (size_t i = 0; i < kFrame; i++) bytes[i] = pattern(i, kFirstFrameSeed);
    for (size_t i = 0; i < kFrame; i++) bytes[kFrame + i] = pattern(i, kSentFrameSeed);
    LF_CHECK(lf_buffer_write(frames, 0, bytes, 2 * kFrame));

    uint64_t sequence = 0;
    LF_CHECK(lf_send_buffer(channel, frames, kFrame, kFrame, kTimeoutNs, &sequence));
    /* The consumer's OpenGL may read and write the frame until it releases the message. */
    LF_CHECK(lf_wait_completed(channel, sequence, kTimeoutNs));

    LF_CHECK(lf_buffer_read(frames, 0, bytes, 2 * kFrame));
    if (!holds("producer, first frame", bytes, kFrame, kFirstFrameSeed)) return 1;
    if (strstr(transport, "vulkan_ipc")) {
        if (!holds("producer, frame sent", bytes + kFrame, kFrame, kGlSeed)) return 1;
        printf("PASS producer reads what OpenGL wrote into the frame it sent (%s)\n", transport);
    } else {
        /* Staged through host memory: OpenGL had a copy, and the consumer says why. */
        if (!holds("producer, frame sent", bytes + kFrame, kFrame, kSentFrameSeed)) return 1;
        printf("producer: the frame went as a copy (%s)\n", transport);
    }
    free(bytes);
    lf_free(frames);
    lf_channel_free(channel);
    lf_location_free(here);
    lf_context_free(context);
    return 0;
}

/* ---- OpenGL through EGL, without a window. -------------------------------------------- */

/* Every GL entry point comes from eglGetProcAddress: the program links libEGL only, and the
 * GL library is the one the EGL display's driver brings. */
typedef const GLubyte *(APIENTRYP PfnGetString)(GLenum name);
typedef void (APIENTRYP PfnGetIntegerv)(GLenum name, GLint *data);
typedef GLenum (APIENTRYP PfnGetError)(void);
typedef void (APIENTRYP PfnFinish)(void);
#define GL_FUNCTIONS(X)                                                          \
    X(PfnGetString, GetString)                                                   \
    X(PfnGetIntegerv, GetIntegerv)                                               \
    X(PfnGetError, GetError)                                                     \
    X(PfnFinish, Finish)                                                         \
    X(PFNGLGETSTRINGIPROC, GetStringi)                                           \
    X(PFNGLGENBUFFERSPROC, GenBuffers)                                           \
    X(PFNGLBINDBUFFERPROC, BindBuffer)                                           \
    X(PFNGLBUFFERDATAPROC, BufferData)                                           \
    X(PFNGLGETBUFFERSUBDATAPROC, GetBufferSubData)                               \
    X(PFNGLCOPYBUFFERSUBDATAPROC, CopyBufferSubData)                             \
    X(PFNGLDELETEBUFFERSPROC, DeleteBuffers)                                     \
    X(PFNGLGETUNSIGNEDBYTEVEXTPROC, GetUnsignedBytevEXT)                         \
    X(PFNGLGETUNSIGNEDBYTEI_VEXTPROC, GetUnsignedBytei_vEXT)                     \
    X(PFNGLCREATEMEMORYOBJECTSEXTPROC, CreateMemoryObjectsEXT)                   \
    X(PFNGLMEMORYOBJECTPARAMETERIVEXTPROC, MemoryObjectParameterivEXT)           \
    X(PFNGLIMPORTMEMORYFDEXTPROC, ImportMemoryFdEXT)                             \
    X(PFNGLBUFFERSTORAGEMEMEXTPROC, BufferStorageMemEXT)                         \
    X(PFNGLDELETEMEMORYOBJECTSEXTPROC, DeleteMemoryObjectsEXT)
#define GL_DECLARE(type, name) type name;
static struct { GL_FUNCTIONS(GL_DECLARE) } gl;

static int has_extension(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list ? strstr(list, name) : NULL; p; p = strstr(p + n, name))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

static int gl_has_extension(const char *name) {
    GLint count = 0;
    gl.GetIntegerv(GL_NUM_EXTENSIONS, &count);
    for (GLint i = 0; i < count; i++)
        if (strcmp((const char *)gl.GetStringi(GL_EXTENSIONS, (GLuint)i), name) == 0) return 1;
    return 0;
}

/* The consumer's OpenGL context, and its driver's UUID, which an import needs to match. */
struct gl_context {
    EGLDisplay display;
    EGLContext context;
    uint8_t driver_uuid[GL_UUID_SIZE_EXT];
};

static void note(char *why, size_t size, const char *what, const char *detail) {
    size_t used = strlen(why);
    snprintf(why + used, size - used, "\n  %s: %s", what, detail);
}

/* Makes an OpenGL context current on `display` if its GPU is the one with `device_uuid` and
 * it imports memory from fds; else 0, with the reason appended to `why`. */
static int open_gl(EGLDisplay display, const char *what, const uint8_t device_uuid[16], struct gl_context *out,
                   char *why, size_t why_size) {
    EGLint major = 0, minor = 0;
    if (display == EGL_NO_DISPLAY || !eglInitialize(display, &major, &minor)) {
        note(why, why_size, what, "eglInitialize failed");
        return 0;
    }
    const char *egl_extensions = eglQueryString(display, EGL_EXTENSIONS);
    if (!has_extension(egl_extensions, "EGL_KHR_surfaceless_context")) {
        note(why, why_size, what, "EGL_KHR_surfaceless_context missing (a context without a surface)");
        eglTerminate(display);
        return 0;
    }
    EGLConfig config = EGL_NO_CONFIG_KHR;
    if (!has_extension(egl_extensions, "EGL_KHR_no_config_context")) {
        /* A mask of 0 takes configs of any surface type: the context never gets a surface. */
        const EGLint wanted[] = {EGL_RENDERABLE_TYPE, EGL_OPENGL_BIT, EGL_SURFACE_TYPE, 0, EGL_NONE};
        EGLint found = 0;
        if (!eglChooseConfig(display, wanted, &config, 1, &found) || found < 1) {
            note(why, why_size, what, "no EGL config renders desktop OpenGL");
            eglTerminate(display);
            return 0;
        }
    }
    const EGLint attributes[] = {EGL_CONTEXT_MAJOR_VERSION, 3, EGL_CONTEXT_MINOR_VERSION, 3,
                                 EGL_CONTEXT_OPENGL_PROFILE_MASK, EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT, EGL_NONE};
    EGLContext context = EGL_NO_CONTEXT;
    if (!eglBindAPI(EGL_OPENGL_API) ||
        (context = eglCreateContext(display, config, EGL_NO_CONTEXT, attributes)) == EGL_NO_CONTEXT ||
        !eglMakeCurrent(display, EGL_NO_SURFACE, EGL_NO_SURFACE, context)) {
        char detail[96];
        snprintf(detail, sizeof detail, "no OpenGL 3.3 core context (EGL error 0x%x)", (unsigned)eglGetError());
        note(why, why_size, what, detail);
        if (context != EGL_NO_CONTEXT) eglDestroyContext(display, context);
        eglTerminate(display);
        return 0;
    }

#define LOAD_GL(type, name) gl.name = (type)eglGetProcAddress("gl" #name);
    GL_FUNCTIONS(LOAD_GL)
#undef LOAD_GL
    const char *renderer = gl.GetString ? (const char *)gl.GetString(GL_RENDERER) : NULL;
    const char *missing = NULL;
    if (!gl.GetString || !gl.GetStringi || !gl.GetIntegerv)
        missing = "the OpenGL 3.0 entry points are missing";
    else if (!gl_has_extension("GL_EXT_memory_object"))
        missing = "GL_EXT_memory_object missing";
    else if (!gl_has_extension("GL_EXT_memory_object_fd"))
        missing = "GL_EXT_memory_object_fd missing (memory imported from an fd)";
    int same_device = 0;
    if (!missing) {
        GLint devices = 0;
        gl.GetIntegerv(GL_NUM_DEVICE_UUIDS_EXT, &devices);
        for (GLint d = 0; d < devices && !same_device; d++) {
            GLubyte uuid[GL_UUID_SIZE_EXT] = {0};
            gl.GetUnsignedBytei_vEXT(GL_DEVICE_UUID_EXT, (GLuint)d, uuid);
            same_device = memcmp(uuid, device_uuid, sizeof uuid) == 0;
        }
        gl.GetUnsignedBytevEXT(GL_DRIVER_UUID_EXT, out->driver_uuid);
    }
    if (missing || !same_device) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s: %s", renderer ? renderer : "OpenGL",
                 missing ? missing : "another GPU than the Vulkan device's (device UUIDs differ)");
        note(why, why_size, what, detail);
        eglMakeCurrent(display, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
        eglDestroyContext(display, context);
        eglTerminate(display);
        return 0;
    }
    printf("PASS OpenGL %s on %s (%s) offers GL_EXT_memory_object_fd on the Vulkan device; "
           "GL_EXT_semaphore_fd %s\n",
           (const char *)gl.GetString(GL_VERSION), renderer, what,
           gl_has_extension("GL_EXT_semaphore_fd") ? "too (unused: binary semaphores only)" : "absent");
    out->display = display;
    out->context = context;
    return 1;
}

/* Tries each EGL device, then Mesa's surfaceless platform, for an OpenGL context on the GPU
 * with `device_uuid`. */
static int find_gl(const uint8_t device_uuid[16], struct gl_context *out, char *why, size_t why_size) {
    const char *client = eglQueryString(EGL_NO_DISPLAY, EGL_EXTENSIONS);
    PFNEGLGETPLATFORMDISPLAYEXTPROC get_display =
        (PFNEGLGETPLATFORMDISPLAYEXTPROC)eglGetProcAddress("eglGetPlatformDisplayEXT");
    if (!has_extension(client, "EGL_EXT_platform_base") || !get_display) {
        note(why, why_size, "EGL",
             "no EGL_EXT_platform_base (eglGetPlatformDisplayEXT): install an EGL driver (libegl-mesa0, or "
             "the GPU driver's EGL library)");
        return 0;
    }
    if (has_extension(client, "EGL_EXT_device_enumeration") && has_extension(client, "EGL_EXT_platform_device")) {
        PFNEGLQUERYDEVICESEXTPROC query_devices =
            (PFNEGLQUERYDEVICESEXTPROC)eglGetProcAddress("eglQueryDevicesEXT");
        EGLDeviceEXT devices[16];
        EGLint count = 0;
        if (query_devices && query_devices(16, devices, &count)) {
            for (EGLint d = 0; d < count; d++) {
                char what[64];
                snprintf(what, sizeof what, "EGL device %d", (int)d);
                if (open_gl(get_display(EGL_PLATFORM_DEVICE_EXT, devices[d], NULL), what, device_uuid, out, why,
                            why_size))
                    return 1;
            }
        }
        if (count == 0) note(why, why_size, "EGL_EXT_platform_device", "no EGL device");
    } else {
        note(why, why_size, "EGL", "EGL_EXT_device_enumeration or EGL_EXT_platform_device missing");
    }
    if (has_extension(client, "EGL_MESA_platform_surfaceless"))
        return open_gl(get_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, NULL),
                       "EGL_MESA_platform_surfaceless", device_uuid, out, why, why_size);
    note(why, why_size, "EGL", "EGL_MESA_platform_surfaceless missing");
    return 0;
}

static void close_gl(struct gl_context *gl_context) {
    eglMakeCurrent(gl_context->display, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
    eglDestroyContext(gl_context->display, gl_context->context);
    eglTerminate(gl_context->display);
}

/* ---- The consumer: the message's buffer in OpenGL. ------------------------------------ */

/* Imports the memory of `exported` into OpenGL as a buffer bound to GL_COPY_WRITE_BUFFER, in
 * which the frame lies at `exported->offset`. The fd is OpenGL's once the import succeeds,
 * else still ours. */
static int import_into_gl(lf_export *exported, GLuint *memory, GLuint *buffer) {
    gl.CreateMemoryObjectsEXT(1, memory);
    if (exported->gpu_flags & LF_EXPORT_GPU_DEDICATED) {
        const GLint dedicated = GL_TRUE;
        gl.MemoryObjectParameterivEXT(*memory, GL_DEDICATED_MEMORY_OBJECT_EXT, &dedicated);
    }
    /* The whole allocation is imported; the frame lies at `offset` inside it. */
    gl.ImportMemoryFdEXT(*memory, exported->arena_size, GL_HANDLE_TYPE_OPAQUE_FD_EXT, exported->fd);
    GLenum error = gl.GetError();
    if (error != GL_NO_ERROR) {
        close(exported->fd);
        fprintf(stderr, "FAIL glImportMemoryFdEXT of %llu bytes: GL error 0x%x\n",
                (unsigned long long)exported->arena_size, error);
        return 1;
    }
    exported->fd = -1;
    /* The buffer starts where the allocation starts and ends where the frame ends, and the
     * frame is read and written at its offset in it. glBufferStorageMemEXT's own offset would
     * give a buffer of the frame alone, but Mesa's llvmpipe ignores it (the buffer then shows
     * the allocation's first bytes); this way is right on every driver. */
    const GLsizeiptr size = (GLsizeiptr)(exported->offset + exported->size);
    gl.GenBuffers(1, buffer);
    gl.BindBuffer(GL_COPY_WRITE_BUFFER, *buffer);
    gl.BufferStorageMemEXT(GL_COPY_WRITE_BUFFER, size, *memory, 0);
    if ((error = gl.GetError()) != GL_NO_ERROR) {
        fprintf(stderr, "FAIL glBufferStorageMemEXT of %lld bytes: GL error 0x%x\n", (long long)size, error);
        return 1;
    }
    return 0;
}

/* Reads the frame in OpenGL, then writes OpenGL's bytes over it with a copy on the GPU from a
 * buffer of OpenGL's own, and waits for the copy (the producer reads after the release). */
static int read_and_write_in_gl(GLintptr offset, size_t size) {
    unsigned char *bytes = malloc(size);
    if (!bytes) return 1;
    gl.GetBufferSubData(GL_COPY_WRITE_BUFFER, offset, (GLsizeiptr)size, bytes);
    if (!holds("OpenGL", bytes, size, kSentFrameSeed)) return 1;
    printf("PASS OpenGL reads the producer's frame (%zu bytes)\n", size);

    for (size_t i = 0; i < size; i++) bytes[i] = pattern(i, kGlSeed);
    GLuint own = 0;
    gl.GenBuffers(1, &own);
    gl.BindBuffer(GL_COPY_READ_BUFFER, own);
    gl.BufferData(GL_COPY_READ_BUFFER, (GLsizeiptr)size, bytes, GL_STATIC_COPY);
    gl.CopyBufferSubData(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, 0, offset, (GLsizeiptr)size);
    gl.Finish();
    gl.DeleteBuffers(1, &own);
    GLenum error = gl.GetError();
    if (error != GL_NO_ERROR) {
        fprintf(stderr, "FAIL writing into the imported buffer: GL error 0x%x\n", error);
        return 1;
    }
    /* What OpenGL wrote, read back by OpenGL: the producer checks it through lava-flow. */
    memset(bytes, 0, size);
    gl.GetBufferSubData(GL_COPY_WRITE_BUFFER, offset, (GLsizeiptr)size, bytes);
    if (!holds("OpenGL, after its copy", bytes, size, kGlSeed)) return 1;
    free(bytes);
    return 0;
}

static int consumer(lf_context *context, const char *name, struct gl_context *gl_context) {
    lf_location *here = NULL;
    LF_CHECK(lf_location_detect(&here));
    lf_channel *channel = NULL;
    LF_CHECK(lf_channel_create(context, name, LF_ROLE_CONSUMER, here, here, NULL, &channel));
    const char *transport = NULL, *reason = NULL;
    LF_CHECK(lf_channel_transport(channel, &transport, &reason));

    lf_message message;
    LF_CHECK(lf_recv(channel, kTimeoutNs, &message));
    if (!(message.flags & LF_MESSAGE_GPU)) {
        printf("SKIP: the channel copies GPU buffers through host memory instead of sending them by reference: "
               "%s (%s)\n",
               transport, reason);
        LF_CHECK(lf_release(channel, &message));
        lf_channel_free(channel);
        lf_location_free(here);
        return SKIP;
    }
    const lf_buffer *frame = NULL;
    LF_CHECK(lf_message_buffer(channel, &message, &frame));
    lf_export exported;
    LF_CHECK(lf_buffer_export(frame, &exported));
    if (memcmp(exported.driver_uuid, gl_context->driver_uuid, sizeof exported.driver_uuid) != 0) {
        close(exported.fd);
        printf("SKIP: OpenGL's driver UUID differs from the Vulkan driver's: OpenGL cannot import its memory\n");
        LF_CHECK(lf_release(channel, &message));
        lf_channel_free(channel);
        lf_location_free(here);
        return SKIP;
    }
    printf("consumer: received %zu bytes by reference through %s: %llu bytes at offset %llu of the producer's "
           "allocation of %llu\n",
           message.len, transport, (unsigned long long)exported.size, (unsigned long long)exported.offset,
           (unsigned long long)exported.arena_size);

    GLuint memory = 0, buffer = 0;
    int failed = import_into_gl(&exported, &memory, &buffer) ||
                 read_and_write_in_gl((GLintptr)exported.offset, exported.size);
    /* OpenGL lets go of the memory before the message goes back to the producer. */
    gl.DeleteBuffers(1, &buffer);
    gl.DeleteMemoryObjectsEXT(1, &memory);
    LF_CHECK(lf_release(channel, &message));
    lf_channel_free(channel);
    lf_location_free(here);
    return failed;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "producer") == 0) return producer(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s              (the consumer, which starts the producer)\n"
                        "       %s producer NAME (the producer of channel NAME)\n",
                argv[0], argv[0]);
        return 2;
    }

    /* OpenGL must run on the GPU of the Vulkan device lava-flow opened: its UUID picks it. */
    lf_context *context = NULL;
    LF_CHECK(lf_context_create(NULL, &context));
    lf_device_info device = {.struct_size = sizeof device};
    if (lf_context_device_info(context, &device) != LF_OK) {
        printf("SKIP: no Vulkan device: %s\n", lf_last_error_message());
        lf_context_free(context);
        return SKIP;
    }
    struct gl_context gl_context;
    char why[2048] = "";
    if (!find_gl(device.device_uuid, &gl_context, why, sizeof why)) {
        printf("SKIP: no OpenGL that imports memory of Vulkan device %s (GL_EXT_memory_object_fd through "
               "headless EGL):%s\n",
               device.name, why);
        lf_context_free(context);
        return SKIP;
    }

    /* The producer is a process of its own, started only now that OpenGL is known to work. */
    char name[64];
    snprintf(name, sizeof name, "opengl-import-%d", (int)getpid());
    char *producer_argv[] = {argv[0], "producer", name, NULL};
    pid_t child = 0;
    int spawn_error = posix_spawn(&child, "/proc/self/exe", NULL, NULL, producer_argv, environ);
    if (spawn_error != 0) {
        fprintf(stderr, "FAIL starting the producer process: %s\n", strerror(spawn_error));
        return 1;
    }
    int consumed = consumer(context, name, &gl_context);
    close_gl(&gl_context);
    lf_context_free(context);

    int status = 0;
    if (waitpid(child, &status, 0) != child) {
        perror("waitpid");
        return 1;
    }
    int produced = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (consumed == SKIP && produced == 0) return SKIP;
    if (consumed != 0 || produced != 0) {
        fprintf(stderr, "FAIL opengl_import: the consumer exited %d, the producer %d\n", consumed, produced);
        return 1;
    }
    printf("PASS opengl_import\n");
    return 0;
}
