/* Control functions of the fake CUDA driver (libferry_fakecuda.so), for tests: call them
 * directly when linking the library, or through dlsym on the handle ferry loaded
 * (ferry__cuda's library), e.g.
 *     void (*fail)(const char *, int, int);
 *     *(void **)&fail = dlsym(cuda->library, "ferry_fake_cuda_fail");
 *
 * Environment read once, when the driver is first used:
 *   FERRY_FAKE_CUDA_DEVICES  number of devices (default 1; 0 allowed)
 *   FERRY_FAKE_CUDA_FAIL     "name:nth:code[,name:nth:code...]": the nth call (1-based,
 *                            counted from process start; 0 = every call) of entry point
 *                            name returns code without doing anything
 *   FERRY_FAKE_CUDA_MEMORY   bytes per device (suffix K, M or G) that cuMemAlloc and
 *                            cuMemCreate may take before CUDA_ERROR_OUT_OF_MEMORY
 *   FERRY_FAKE_CUDA_HIDE     "name[,name...]": entry points cuGetProcAddress_v2 does not
 *                            find (to test a driver that lacks them) */
#ifndef FERRY_FAKE_CUDA_CONTROL_H
#define FERRY_FAKE_CUDA_CONTROL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the nth call of entry point name (e.g. "cuMemAlloc"), counted from the calls made
 * after this one (1 = the next), return code instead of doing anything; nth 0: every call
 * from now on. Several failures may be armed for one name. Code 0 clears those of name. */
__attribute__((visibility("default"))) void ferry_fake_cuda_fail(const char *name, int nth,
                                                                 int code);

/* Calls of entry point name so far (failed ones included); 0 for unknown names. */
__attribute__((visibility("default"))) unsigned long ferry_fake_cuda_calls(const char *name);

/* Clears every injected failure (those of FERRY_FAKE_CUDA_FAIL too) and every counter. */
__attribute__((visibility("default"))) void ferry_fake_cuda_reset(void);

/* Resources not yet released in this process: allocations (cuMemAlloc), IPC mappings (one
 * per cuIpcOpenMemHandle not yet closed), host registrations, VMM allocation handles,
 * mappings and address reservations. 0 after an exact rollback. */
__attribute__((visibility("default"))) int ferry_fake_cuda_live_allocations(void);

/* Bytes that the process's memory pools hold (cuMemAllocFromPoolAsync blocks, allocated or
 * free, until cuMemPoolTrimTo releases the free ones). */
__attribute__((visibility("default"))) unsigned long long ferry_fake_cuda_pool_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
