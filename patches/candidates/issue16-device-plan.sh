#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md) after session m: the chain 0072-0099 passed the turbo suite and the full
# FA suite on the GPU (run r9, `git show b29ba54:patches/candidates/issue16-device-plan.sh`), but its 2-query A/B was
# void: the old hook moved only the turbo rule's boundary, and upstream's rule below it (Ada and newer, quantized K/V,
# at most 2 queries: the vector kernel) kept 2 queries on the vector kernel on both sides. The mended hook sends every
# turbo batch past EXP_TURBO_VEC_MAX to the decoding kernel. This plan settles 2 queries, correctness first.
# .whl/prebuilt.tar.xz (ignored): `scripts/cuda_host_build.sh` of the chain with issue16-ab-hooks.diff applied (its
# test-backend-ops then has the 2-4-token turbo cases at head sizes 256 and 512 too, which the decoding kernel would
# take with 2 tokens at GQA 4), then `VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec1 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=1
# scripts/gpu_check.sh OUT variant use-variant use-base` and `scripts/gpu_check.sh OUT pack` on this host: the device
# builds nothing. Carry .whl/prebuilt.tar.xz, .whl/gguf-py.tar.xz and the three wheels (not the pinned pack: the
# carry limit).
#   scripts/device_job.sh start r10 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r10 540        (again until DONE; a poll on a fresh machine exits 3 at once)
set -u
o=/tmp/r10; mkdir -p $o
g() { bash scripts/gpu_check.sh $o "$@"; }
PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
export VARIANT_INSTANCES=fattn.cu
# the decoding kernel with 2 queries against the CPU
OPS_FA_PATTERN='nb=2,.*type_V=turbo' VARIANT_NAME=vec1 g use-variant ops-fa
# 2 queries: the vector kernel (base) against the decoding kernel (vec1), one head size at a time
for hs in 64 256 512 128; do
  export FA_PERF_PATTERN="hsk=$hs,.*kv=(32768|131072),nb=2,.*type_K=(turbo3|q8_0)" TAG=-nb2-hd$hs
  g use-base fa-perf
  VARIANT_NAME=vec1 g use-variant fa-perf
  python3 scripts/fa_perf_table.py base=$o/fa-perf$TAG-base/perf.txt vec1=$o/fa-perf$TAG-vec1/perf.txt \
    > $o/fa-perf-vec1-hd$hs.md 2>&1
done
