/*
 * TEST-ONLY stand-in for the NVIDIA driver library, libcuda.so.1, on machines without one.
 *
 * The only build of parakeet.cpp on PyPI (parakeet-cpp-cuda) links ggml's CUDA backend, and
 * that library names libcuda.so.1 as a dependency: without the driver it cannot even be
 * loaded, so the runtime cannot take the CPU path it has. This library answers every driver
 * call the way a driver does on a machine with no GPU: CUDA_ERROR_NO_DEVICE. ggml then
 * reports that CUDA failed to initialise and decodes on the CPU.
 *
 * tests/test_engine_parakeet.py builds it into a temporary folder (gcc -shared) and puts that
 * folder on LD_LIBRARY_PATH of a child process only. Talkies never ships or loads it: the
 * production code asks the system loader for the real libcuda.so.1.
 *
 * The functions are the driver symbols libggml-cuda.so imports, plus the two that the CUDA
 * runtime (libcudart) calls first. Their argument types only need the right sizes.
 */

#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUhandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

static const char no_device[] =
    "no CUDA-capable device is detected (talkies test stand-in for libcuda.so.1)";

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }

CUresult cuDriverGetVersion(int *version) {
    if (version) *version = 0;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error;
    if (text) *text = no_device;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(int *device, int ordinal) {
    (void)device; (void)ordinal;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
    (void)value; (void)attribute; (void)device;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemAddressReserve(CUhandle *ptr, size_t size, size_t alignment, CUhandle addr,
                             unsigned long long flags) {
    (void)ptr; (void)size; (void)alignment; (void)addr; (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemAddressFree(CUhandle ptr, size_t size) {
    (void)ptr; (void)size;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemCreate(CUhandle *handle, size_t size, const void *prop, unsigned long long flags) {
    (void)handle; (void)size; (void)prop; (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemRelease(CUhandle handle) { (void)handle; return CUDA_ERROR_NO_DEVICE; }

CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option) {
    (void)granularity; (void)prop; (void)option;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemMap(CUhandle ptr, size_t size, size_t offset, CUhandle handle,
                  unsigned long long flags) {
    (void)ptr; (void)size; (void)offset; (void)handle; (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemUnmap(CUhandle ptr, size_t size) {
    (void)ptr; (void)size;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuMemSetAccess(CUhandle ptr, size_t size, const void *desc, size_t count) {
    (void)ptr; (void)size; (void)desc; (void)count;
    return CUDA_ERROR_NO_DEVICE;
}
