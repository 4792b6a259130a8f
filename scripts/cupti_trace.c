// A kernel trace for machines without Nsight Systems: a CUDA injection library that records every kernel,
// memcpy and memset of a process with CUPTI's activity API and writes them as CSV (start and duration in ns,
// name, grid) to $CUPTI_TRACE_OUT at exit. scripts/decode_trace_split.py splits such a trace into decode steps.
//
//   gcc -O2 -shared -fPIC -o libcupti_trace.so scripts/cupti_trace.c -I$CUDA/include -L$CUDA/lib64 -lcupti
//   CUDA_INJECTION64_PATH=$PWD/libcupti_trace.so CUPTI_TRACE_OUT=trace.csv llama-bench ... --no-warmup
//
// Kernels launched with programmatic dependent launch (PDL) start before their predecessor ends and wait in
// the GPU, so their durations overlap: add up GPU-busy time as the union of the intervals, not the sum.
//
// The host's CUDA graph and synchronization calls (capture, instantiation, update, launch, stream and event
// waits) are recorded too, as rows named "api NAME" on the same clock: what the host does between the GPU's
// work, e.g. whether a step's graph was captured again or only launched.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE * out;

// the runtime calls worth a row: graphs and the waits (kernel launches and copies show as GPU activity)
static int api_recorded(const char * name) {
    static const char * prefixes[] = {
        "cudaGraph", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaStreamSynchronize",
        "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
    };
    for (size_t i = 0; i < sizeof(prefixes)/sizeof(prefixes[0]); ++i) {
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) {
            return 1;
        }
    }
    return 0;
}

static void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *size = 8u << 20;
    *buffer = (uint8_t *) aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t * buffer, size_t size, size_t valid) {
    CUpti_Activity * rec = NULL;
    (void) ctx; (void) stream; (void) size;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (!out) continue;
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 * k = (const CUpti_ActivityKernel10 *) rec;
            fprintf(out, "%llu,%llu,\"%s\",%u,%u,%u\n", (unsigned long long) k->start,
                    (unsigned long long) (k->end - k->start), k->name, k->gridX, k->gridY, k->gridZ);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 * m = (const CUpti_ActivityMemcpy6 *) rec;
            fprintf(out, "%llu,%llu,\"memcpy kind %u %llu B\",0,0,0\n", (unsigned long long) m->start,
                    (unsigned long long) (m->end - m->start), (unsigned) m->copyKind, (unsigned long long) m->bytes);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI * a = (const CUpti_ActivityAPI *) rec;
            const char * name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) == CUPTI_SUCCESS && name &&
                api_recorded(name)) {
                fprintf(out, "%llu,%llu,\"api %s\",0,0,0\n", (unsigned long long) a->start,
                        (unsigned long long) (a->end - a->start), name);
            }
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 * m = (const CUpti_ActivityMemset4 *) rec;
            fprintf(out, "%llu,%llu,\"memset %llu B\",0,0,0\n", (unsigned long long) m->start,
                    (unsigned long long) (m->end - m->start), (unsigned long long) m->bytes);
        }
    }
    free(buffer);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
}

int InitializeInjection(void) {
    const char * path = getenv("CUPTI_TRACE_OUT");
    out = fopen(path ? path : "cupti_trace.csv", "w");
    if (out) fprintf(out, "Start (ns),Duration (ns),Name,gx,gy,gz\n");
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    atexit(at_exit);
    return 1;
}
