#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), after session l moved 0097 in and kept 0096 off at head size 64: the
# vector/decoding kernel boundary for TurboQuant K/V with 3 and 4 queries (speculative verify batches, a few agents),
# at every head size. Session l measured it at head size 128 only (the decoding kernel 1.24-1.28x faster with 4
# queries). With .whl/prebuilt.tar.xz (`gpu_check.sh OUT pack` of a build with issue16-ab-hooks.diff, made on a host
# without a GPU: patches/README.md says how; its test-backend-ops has 0095's 3- and 4-query cases) the device builds
# nothing and the tree's chain state does not matter. Carry .whl/prebuilt.tar.xz, .whl/gguf-py.tar.xz and the three
# wheels (gitpython, gitdb, smmap):
#   scripts/device_job.sh start r8 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r8 540        (again until DONE; a poll on a fresh machine exits 3 at once)
# Without the archive, carry .whl whole; the device builds (about 340 s) and compiles the side.
set -u
o=/tmp/r8; mkdir -p $o
export BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff
g() { bash scripts/gpu_check.sh $o "$@"; }
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
else
  g build || exit 1
  grep -q "build: exit 0" $o/summary.txt || exit 1
  VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec2 VARIANT_DEFS="-DEXP_TURBO_VEC_MAX=2" g variant > $o/variants.out 2>&1
fi
# vec2: the decoding kernel from 3 queries on, against the vector kernel up to 4 (base), the turbo pairs (f16 runs the
# same kernel on both sides); one head size at a time, both sides, so that a run cut short still has whole pairs
export VARIANT_INSTANCES=fattn.cu
for hs in 64 256 512 128; do
  export FA_PERF_PATTERN="hsk=$hs,.*kv=(32768|131072),nb=[34],.*type_K=(turbo3|q8_0)" TAG=-nb34-hd$hs
  g use-base fa-perf
  VARIANT_NAME=vec2 g use-variant fa-perf
  python3 scripts/fa_perf_table.py base=$o/fa-perf$TAG-base/perf.txt vec2=$o/fa-perf$TAG-vec2/perf.txt \
    > $o/fa-perf-vec2-hd$hs.md 2>&1
done
g use-base
