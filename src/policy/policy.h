/* The machine as ferry sees it, and the transport policy decided from it.
 *
 * probe.c runs the real probes (the CUDA driver, each GPU's identity, CUDA VMM handle types,
 * stream memory operations on registered host memory, peer access, MPS), each at most once
 * per process; decide.c turns what they found into one decision (which transport
 * FERRY_BACKEND_AUTO picks, and why), used by ferry_pool_create, ferry_backend_resolve and
 * the doctor's report alike; report.c renders the doctor's report (text or JSON). */
#ifndef FERRY_POLICY_POLICY_H
#define FERRY_POLICY_POLICY_H

#include <limits.h>
#include <stddef.h>

#include "driver/driver.h"
#include "ferry.h"

#define FERRY__PROBE_TEXT 512
#define FERRY__PROBE_LONG 4096
/* ferry__policy_decide's device for the machine as a whole (the doctor's "transport"). */
#define FERRY__POLICY_MACHINE INT32_MIN

/* One real probe: the driver's attribute (1, 0, or -1 when the driver does not answer),
 * whether it ran, and whether doing the thing worked (err: the failure). */
typedef struct ferry__probe {
    int attribute;
    int ran;
    int works;
    char err[FERRY__PROBE_TEXT];
} ferry__probe;

typedef struct ferry__gpu {
    int index;
    CUdevice dev;
    int identified, vmm_done, memops_done; /* which probes ran */
    char error[FERRY__PROBE_TEXT];         /* the device could not be queried at all */
    char name[256];
    int cc_major, cc_minor; /* -1: unknown */
    char pci[32];
    int vmm_api; /* the driver has the VMM entry points */
    int vmm_attribute;
    size_t granularity; /* 0: unknown */
    ferry__probe posix_fd, fabric, memops;
    signed char peer[FERRY_MAX_DEVICES]; /* 1 yes, 0 no, -1 the query failed */
    char peer_err[FERRY__PROBE_TEXT];
} ferry__gpu;

typedef struct ferry__mps {
    char pipe_dir[PATH_MAX];
    int pipe;         /* the control pipe exists: clients started now use MPS */
    long control_pid; /* 0: none visible */
    long server_pid;
} ferry__mps;

typedef struct ferry__machine {
    int loaded;                    /* the driver was looked for */
    const ferry__cuda *cuda;       /* NULL without a driver */
    char error[FERRY__PROBE_TEXT]; /* why there is none */
    char file[PATH_MAX];           /* the file the driver was loaded from */
    int count;                     /* GPUs examined (at most FERRY_MAX_DEVICES) */
    ferry__gpu gpus[FERRY_MAX_DEVICES];
    int peers_done, mps_done;
    ferry__mps mps;
} ferry__machine;

/* The process's machine, locked (every probe and every read happens under the lock), with
 * the driver looked for. NULL (NO_MEMORY) only if its memory cannot be had. */
ferry__machine *ferry__machine_lock(void);
void ferry__machine_unlock(void);

/* Probes every GPU (identity, VMM, stream memory operations), peer access and MPS. */
void ferry__probe_all(ferry__machine *m);
/* Probes what the decision for one device needs: its identity and stream memory operations. */
void ferry__probe_device(ferry__machine *m, int device);

/* The decision: the backend for data on device (a GPU ordinal; negative: host memory;
 * FERRY__POLICY_MACHINE: the machine's GPU transport, as the doctor reports it) and why.
 * INVALID_ARGUMENT for a GPU ordinal the driver does not have. The probes it needs must
 * have run. */
ferry_status ferry__policy_decide(const ferry__machine *m, int32_t device, ferry_backend *backend,
                                  char *reason, size_t size);
/* The handle type the CUDA VMM transport would export, as the doctor reports it. */
void ferry__policy_vmm(const ferry__machine *m, char *buf, size_t size);

/* A pool configuration with FERRY_BACKEND_AUTO resolved (the choice logged once per process
 * and device) and FERRY_DEVICE_DEFAULT made GPU 0 for the GPU backends. */
ferry_status ferry__policy_resolve_config(const ferry_pool_config *config, ferry_pool_config *out);

#endif
