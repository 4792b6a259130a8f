#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), run r11: r10's 2-query A/B (not run in sessions m and n: no device
# time left); the kblock side (EXP_K_BLOCK: each thread reads 64 consecutive values of a turbo or q8_0 K row, one or
# two whole blocks, as 32-bit words); where a 4-agent step at 128k spends the ~1 ms that its FA kernel does not
# explain (session m); then issue 16's table on the base side. In that order, so that a short budget still settles
# the first questions.
# The build comes one of two ways, whichever is in .whl/ (ignored):
# - prebuilt.tar.xz: `scripts/cuda_host_build.sh` of the chain with issue16-ab-hooks.diff applied, then
#   `VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec1 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=1 scripts/gpu_check.sh OUT variant
#   use-variant use-base`, the same for VARIANT_INSTANCES="$kblock_instances" (below) VARIANT_NAME=kblock
#   VARIANT_DEFS=-DEXP_K_BLOCK=1, and `scripts/gpu_check.sh OUT pack` on this host (44 min on 2 cores without ccache in
#   session n; it saves the device's 472 s build, so it pays only when less than ~15 minutes of device time are left).
#   Carry prebuilt.tar.xz, gguf-py.tar.xz and the three wheels (not llama.tar.xz: the 64 MiB carry limit).
# - llama.tar.xz (`polyforge vendor pack --full .whl/llama.tar.xz`) and the three wheels: the device builds the chain
#   with the hooks diff and compiles the vec1 and kblock sides itself.
#   scripts/device_job.sh start r11 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r11 540        (again until DONE; a poll on a fresh machine exits 3 at once)
set -u
o=/tmp/r11; mkdir -p $o
g() { bash scripts/gpu_check.sh $o "$@"; }
kblock_instances="turbo2-turbo2 turbo3-turbo3 turbo4-turbo4 q8_0-turbo2 q8_0-turbo3 q8_0-turbo4"
export VARIANT_INSTANCES=fattn.cu
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
else
  BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff g build || exit 1
  VARIANT_NAME=vec1 VARIANT_DEFS=-DEXP_TURBO_VEC_MAX=1 g variant || exit 1
  VARIANT_INSTANCES=$kblock_instances VARIANT_NAME=kblock VARIANT_DEFS=-DEXP_K_BLOCK=1 g variant || exit 1
fi
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
unset FA_PERF_PATTERN TAG
# kblock against the chain: correctness (every turbo-V and turbo-K case), the kernel alone, decode
kb() { VARIANT_INSTANCES=$kblock_instances VARIANT_NAME=kblock g "$@"; }
OPS_FA_PATTERN='type_K=(turbo[234]|q8_0),type_V=turbo|type_K=turbo' kb use-variant ops-fa
FA_PERF_PATTERN='hsk=(128|256|512),.*kv=(32768|131072),nb=1,.*type_K=(turbo3|q8_0)' TAG=-nb1 kb use-base fa-perf use-variant fa-perf
python3 scripts/fa_perf_table.py base=$o/fa-perf-nb1-base/perf.txt kblock=$o/fa-perf-nb1-kblock/perf.txt \
  > $o/fa-perf-kblock-nb1.md 2>&1
TG_SHAPES="512 256 128" TG_KV="turbo3/turbo3 q8_0/turbo3 turbo4/turbo4 f16/f16" TG_DEPTHS=4096,32768,131072 \
  kb use-base tg use-variant tg use-base
# 4 agents sharing a 128k prefix: each kernel's own time per step, f16 against turbo3
AGENTS_B=4 DEPTH=131072 KV="f16/f16 turbo3/turbo3" g use-base agents-trace
# issue 16's table (the base side is the chain as landed)
g agents bench heads pp
