#!/usr/bin/env bash
# Issue 16's device plan for the candidates, on the H200 (../shared/device.md). Here, first:
#   polyforge unapply --to 0092 && git mv patches/candidates/009[34678]-*.patch patches/ && polyforge lock
# then on the device, carrying .whl/prebuilt.tar.xz, .whl/gguf-py.tar.xz and the three wheels (gitpython, gitdb,
# smmap; with .whl/llama.tar.xz as well the carry passes 64 MiB), or .whl whole where there is no prebuilt archive:
#   scripts/device_job.sh start r6 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r6 540        (again until DONE; a poll on a fresh machine exits 3 at once)
# With .whl/prebuilt.tar.xz (`gpu_check.sh OUT pack` of the same chain and hooks, built on a host without a GPU:
# patches/README.md says how) the device builds nothing; otherwise it builds (about 340 s) and compiles the sides.
# Ordered so that what the issue's "done" needs comes first: the turbo suite, the kernel A/B, agents, the full FA suite.
set -u
o=/tmp/r6; mkdir -p $o
export BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff
# 0094 and 0096's kernels (the decoding kernel's turbo3 instances of the agents shapes): what nostage and nospan recompile
export VARIANT_INSTANCES="fattn-mma-f16-kv-dec-instance-ncols1_8-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_32-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_4-turbo3-turbo3"
g() { bash scripts/gpu_check.sh $o "$@"; }
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
  variants() { :; }
else
  g build || exit 1
  grep -q "build: exit 0" $o/summary.txt || exit 1
  variants() {
    VARIANT_NAME=nostage VARIANT_DEFS="-DEXP_NO_STAGE=1 -DEXP_NO_WIDE=1" g variant
    VARIANT_NAME=nospan VARIANT_DEFS="-DEXP_NO_SPAN=1" g variant
    VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec2 VARIANT_DEFS="-DEXP_TURBO_VEC_MAX=2" g variant
  }
fi
( export PYTHONPATH=/tmp/polyforge-site:$PWD POLYFORGE_CMAKE=$(command -v cmake) POLYFORGE_NINJA=$(command -v ninja)
  python3 -m polyforge models fetch "random:n_layer=16,n_embd=2048,n_head=16,n_head_kv=8,n_ff=5632,n_vocab=32000,n_ctx=140000" > $o/model.log 2>&1 ) &
variants > $o/variants.out 2>&1 &
g ops-turbo
wait
# the kernel A/B: issue 16's agents cells at hd128 (4-32 queries) and hd64 (16), both lengths; nostage is 0093 alone
export FA_PERF_PATTERN='hsk=(64|128),.*nr23=\[[24],1\],kv=(32768|131072),nb=(4|8|16|32),'
g use-base fa-perf
VARIANT_NAME=nostage g use-variant fa-perf
g use-base
AGENTS=1,4,8,16,32 AGENTS_KV=f16/f16,turbo3/turbo3,q8_0/turbo3 g agents
g ops-fa
AGENTS=8,16,32 AGENTS_KV=f16/f16,turbo3/turbo3 VARIANT_NAME=nostage g use-variant agents
VARIANT_NAME=nospan g use-variant fa-perf
# the kernel choice at 3-4 queries: the decoding kernel from 3 on (vec2) against the vector kernel, and its results
VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec2 FA_PERF_PATTERN='hsk=128,.*kv=(32768|131072),nb=4,' g use-variant fa-perf
( . "build/$(cat build/gpu-check.key)/prebuilt.env" 2>/dev/null
  "build/$(cat build/gpu-check.key)/bin/test-backend-ops" -o FLASH_ATTN_EXT -b CUDA0 -p 'nb=[34],.*type_V=turbo' ) > $o/ops-fa-vec2.log 2>&1
echo "vec2 FLASH_ATTN_EXT nb 3-4 turbo V: $(grep -E 'tests passed' $o/ops-fa-vec2.log)" >> $o/summary.txt
AGENTS=4 AGENTS_KV=f16/f16,turbo3/turbo3,q8_0/turbo3 VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec2 g use-variant agents
VARIANT_INSTANCES=fattn.cu g use-base
python3 scripts/fa_perf_table.py base=$o/fa-perf-base/perf.txt nostage=$o/fa-perf-nostage/perf.txt \
  nospan=$o/fa-perf-nospan/perf.txt vec2=$o/fa-perf-vec2/perf.txt > $o/fa-perf-ab.md 2>&1
unset FA_PERF_PATTERN
TAG=-all g fa-perf
# what time is left: single-sequence decode at issue 16's other head sizes
g heads
