#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), run r14. r13 (session p, patches/README "The chain 0072-0103 on the
# GPU") left two rows furthest from their goals, each with a trace that names its cost: agents at B = 16-32, where the
# decoding tensor-core kernel at 64 columns is 0.80 of f16's with about a fifth of its bytes (so bound by its own
# instructions or latency), and pp512 at 32k, where 0083's conversion is the whole difference. r14 looks inside the
# first: one launch of that kernel under ncu (--set full, the SASS page with its stall samples) for f16/f16 and
# turbo3/turbo3 at B = 32 and a 128k prefix, then the 32k agents row (the one closest to its goal: turbo3 0.96-1.04)
# as medians of 3 runs.
# The build: this plan needs no A/B side, so either way works (.whl/ is ignored and does not outlive a session):
# - .whl/prebuilt.tar.xz (carry .whl without llama.tar.xz, the 64 MiB carry limit): in a clone at /tmp/pb, vendor
#   fetch, apply, `git apply` the hooks diff in the tree, scripts/cuda_host_build.sh (its key into
#   build/gpu-check.key), then `scripts/gpu_check.sh OUT pack` (32 min on 2 cores in session p);
# - or .whl/llama.tar.xz (`polyforge vendor pack --full`): the device builds the chain (326 s in session p).
#   scripts/device_job.sh start r14 bash patches/candidates/issue16-device-plan.sh; scripts/device_job.sh poll r14 540
#   scripts/device_job.sh poll r14 SECONDS      (again at once until DONE: a warm machine is released after 30 s idle)
set -u
o=/tmp/r14; mkdir -p $o
g() { bash scripts/gpu_check.sh $o "$@"; }
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
else
  BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff g build || exit 1
fi
AGENTS_B=32 DEPTH=131072 KV="f16/f16 turbo3/turbo3" g agents-ncu
AGENTS=4,8,16,32 PREFIX=32768 ROUNDS=3 TAG=-32k-r3 g agents
