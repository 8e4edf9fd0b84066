#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    cl_platform_id p[8]; cl_uint np = 0;
    if (clGetPlatformIDs(8, p, &np) != CL_SUCCESS || np == 0) { printf("no OpenCL platform\n"); return 0; }
    for (cl_uint i = 0; i < np; i++) {
        char name[256] = "", ver[256] = "", ext[16384] = "";
        clGetPlatformInfo(p[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        clGetPlatformInfo(p[i], CL_PLATFORM_VERSION, sizeof ver, ver, NULL);
        printf("platform %u: %s (%s)\n", i, name, ver);
        cl_device_id d[8]; cl_uint nd = 0;
        clGetDeviceIDs(p[i], CL_DEVICE_TYPE_ALL, 8, d, &nd);
        for (cl_uint j = 0; j < nd; j++) {
            char dn[256] = "";
            clGetDeviceInfo(d[j], CL_DEVICE_NAME, sizeof dn, dn, NULL);
            clGetDeviceInfo(d[j], CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
            printf("  device %u: %s\n  extensions: %s\n", j, dn, ext);
            printf("  memory sharing extensions:");
            char *tok = strtok(ext, " ");
            while (tok) { if (strstr(tok, "external") || strstr(tok, "export") || strstr(tok, "sharing") || strstr(tok, "dmabuf")) printf(" %s", tok); tok = strtok(NULL, " "); }
            printf("\n");
        }
    }
    return 0;
}
