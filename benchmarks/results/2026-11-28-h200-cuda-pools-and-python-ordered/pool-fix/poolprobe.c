#include "../../benchmarks/cuda_driver_api.h"
#include <stdint.h>
typedef cu_result (*attr_fn)(void *, int, cu_deviceptr);
typedef cu_result (*exp_fn)(void *, cu_deviceptr);
typedef cu_result (*range_fn)(cu_deviceptr *, size_t *, cu_deviceptr);
int main(void) {
    char why[256];
    if (!cu_load(why, sizeof why)) { printf("no cuda: %s\n", why); return 0; }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    attr_fn attr = (attr_fn)dlsym(lib, "cuPointerGetAttribute");
    exp_fn exp = (exp_fn)dlsym(lib, "cuMemPoolExportPointer");
    range_fn range = (range_fn)dlsym(lib, "cuMemGetAddressRange_v2");
    int dev = 0; cu_context ctx;
    cu.device_get(&dev, 0); cu.primary_ctx_retain(&ctx, dev); cu.ctx_set_current(ctx);
    cu_mem_pool_props props; memset(&props, 0, sizeof props);
    props.alloc_type = 1; props.handle_types = 1; props.location.type = 1; props.location.id = 0;
    cu_mem_pool pool; cu_result r = cu.mem_pool_create(&pool, &props); printf("pool create %d\n", r);
    cu_deviceptr p[3];
    for (int i = 0; i < 3; i++) { r = cu.mem_alloc_from_pool_async(&p[i], 2 << 20, pool, NULL); printf("alloc %d: %d %#llx\n", i, r, p[i]); }
    cu.stream_synchronize(NULL);
    for (int i = 0; i < 3; i++) {
        cu_deviceptr start = 0; size_t size = 0; unsigned long long id = 0; void *mp = 0; cu_context c = 0;
        r = range(&start, &size, p[i]); printf("range %d: %d start %#llx size %zu\n", i, r, start, size);
        attr(&start, 11, p[i]); attr(&size, 12, p[i]); printf("  attr RANGE_START %#llx RANGE_SIZE %zu\n", start, size);
        attr(&id, 7, p[i]); attr(&mp, 17, p[i]); attr(&c, 1, p[i]); printf("  BUFFER_ID %llu MEMPOOL %p CONTEXT %p\n", id, mp, c);
        unsigned char data[64];
        r = exp(data, p[i]); printf("  export(ptr) %d %s\n", r, cu_error(r));
        r = exp(data, p[i] + 4096); printf("  export(ptr+4096) %d\n", r);
        if (start != p[i]) { r = exp(data, start); printf("  export(range start) %d\n", r); }
    }
    /* In the primary context pushed? Try without a current context. */
    cu_context none = NULL; cu.ctx_set_current(none);
    unsigned char data[64]; r = exp(data, p[0]); printf("export with no current context: %d %s\n", r, cu_error(r));
    return 0;
}
