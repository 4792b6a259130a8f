#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), run r12: the chain 0072-0103 proven against the CPU (0100-0102 came
# from r11's A/B sides, but this exact chain has not run), issue 16's table on it, then the 2-query choice where r11
# left it open: head size 512 now that the vector kernel reads whole K blocks (0100/0101), and the 8B shape (head size
# 128, GQA 4), where 0102 sends 2 queries to the decoding kernel by analogy with head size 64. In that order, so that
# a short budget still settles the first questions.
# The build comes one of two ways, whichever is in .whl/ (ignored):
# - prebuilt.tar.xz: `scripts/cuda_host_build.sh` of the chain with issue16-ab-hooks.diff applied, then
#   `VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec1 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=1 scripts/gpu_check.sh OUT variant`,
#   the same with VARIANT_NAME=vec2 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=2, then `scripts/gpu_check.sh OUT use-variant
#   use-base pack` for each side on this host (44 min on 2 cores without ccache in session n; it saves the device's
#   ~450 s build, so it pays only when less than ~15 minutes of device time are left). Carry prebuilt.tar.xz,
#   gguf-py.tar.xz and the three wheels (not llama.tar.xz: the 64 MiB carry limit).
# - llama.tar.xz (`polyforge vendor pack --full .whl/llama.tar.xz`) and the three wheels: the device builds the chain
#   with the hooks diff and compiles the vec1 and vec2 sides itself.
#   scripts/device_job.sh start r12 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r12 540        (again at once until DONE: a warm machine is released after 30 s idle)
set -u
o=/tmp/r12; mkdir -p $o
g() { bash scripts/gpu_check.sh $o "$@"; }
export VARIANT_INSTANCES=fattn.cu
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
else
  BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff g build || exit 1
  VARIANT_NAME=vec1 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=1 g variant || exit 1
  VARIANT_NAME=vec2 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=2 g variant || exit 1
fi
# the chain as it lands (base side): its types and every FA case against the CPU
VARIANT_NAME=vec1 g use-base ops-turbo ops-fa
# issue 16's table (0103 shortens the host part of an agents step)
g agents bench heads pp
# 2 queries: 0102's choice (base) against every 2-query batch on the decoding kernel (vec1) and on the vector
# kernel (vec2, 0099's rule), at head size 512 (both GQA) and 128 (the 886M's GQA 2 and the 8B's GQA 4)
for c in "512 hsk=512,.*nr23=\[[24],1\],kv=(32768|131072),nb=2," "128 hsk=128,.*nr23=\[[24],1\],kv=(32768|131072),nb=2,"; do
  hs=${c%% *}; export FA_PERF_PATTERN="${c#* }.*type_K=(turbo3|q8_0)" TAG=-nb2-hd$hs
  g use-base fa-perf
  VARIANT_NAME=vec1 g use-variant fa-perf
  VARIANT_NAME=vec2 g use-variant fa-perf
  python3 scripts/fa_perf_table.py base=$o/fa-perf$TAG-base/perf.txt vec1=$o/fa-perf$TAG-vec1/perf.txt \
    vec2=$o/fa-perf$TAG-vec2/perf.txt > $o/fa-perf-2q-hd$hs.md 2>&1
done
unset FA_PERF_PATTERN TAG
VARIANT_NAME=vec1 g use-base
# 2 agents sharing a prefix on the 8B shape (GQA 4, head size 128): where 0102 changes a real decode step
AGENTS=2 PREFIX=32768,131072 SHAPE=n_embd=4096,n_head=32,n_head_kv=8 TAG=-8b g agents
