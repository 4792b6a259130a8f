#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), after session k landed 0093, 0094, 0096 and 0098: what is still open
# about them and the candidate 0097. With .whl/prebuilt.tar.xz (`gpu_check.sh OUT pack` of the chain plus 0097 and
# issue16-ab-hooks.diff, built on a host without a GPU: patches/README.md says how) the device builds nothing and the
# tree's chain state does not matter. Carry .whl/prebuilt.tar.xz, .whl/gguf-py.tar.xz and the three wheels (gitpython,
# gitdb, smmap; with .whl/llama.tar.xz as well the carry passes 64 MiB):
#   scripts/device_job.sh start r7 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r7 540        (again until DONE; a poll on a fresh machine exits 3 at once)
# Without the archive, first `git mv patches/candidates/0097-*.patch patches/ && polyforge lock` (the hooks diff
# touches 0097's code), carry .whl whole; the device builds (about 340 s) and compiles the sides.
# Ordered by what decides a patch: 0096 at head size 64, then 0097, then the kernel boundary at 3-4 queries.
set -u
o=/tmp/r7; mkdir -p $o
export BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff
# the decoding kernel of hd64 with 16 queries at GQA 4 (64 columns), turbo3 and q8_0/turbo3
hd64_instances="fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_4-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_4-q8_0-turbo3"
agents_instances="fattn-mma-f16-kv-dec-instance-ncols1_8-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_32-ncols2_2-turbo3-turbo3 fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_4-turbo3-turbo3"
g() { bash scripts/gpu_check.sh $o "$@"; }
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
  variants() { :; }
else
  g build || exit 1
  grep -q "build: exit 0" $o/summary.txt || exit 1
  variants() {
    VARIANT_INSTANCES="$agents_instances" VARIANT_NAME=nostage VARIANT_DEFS="-DEXP_NO_STAGE=1 -DEXP_NO_WIDE=1" g variant
    VARIANT_INSTANCES="$hd64_instances" VARIANT_NAME=wide128 VARIANT_DEFS="-DEXP_WIDE_MIN_D=128" g variant
    VARIANT_INSTANCES=convert.cu VARIANT_NAME=no0097 VARIANT_DEFS="-DEXP_NO_Q8_NC=1" g variant
    VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec2 VARIANT_DEFS="-DEXP_TURBO_VEC_MAX=2" g variant
  }
fi
( export PYTHONPATH=/tmp/polyforge-site:$PWD POLYFORGE_CMAKE=$(command -v cmake) POLYFORGE_NINJA=$(command -v ninja)
  python3 -m polyforge models fetch "random:n_layer=16,n_embd=2048,n_head=16,n_head_kv=8,n_ff=5632,n_vocab=32000,n_ctx=140000" > $o/model.log 2>&1
  python3 -m polyforge models fetch "random:n_layer=16,n_embd=2048,n_head=32,n_head_kv=8,n_ff=5632,n_vocab=32000,n_ctx=140000" >> $o/model.log 2>&1 ) &
variants > $o/variants.out 2>&1
# 0096 at head size 64: 8 warps at 64 columns there (base) against 4 (wide128: 0096 from head size 128 on, staging kept)
# and against neither staging nor 8 warps (nostage); session k: base 0.91 / 0.97 of nostage at 32k / 128k
export VARIANT_INSTANCES="$hd64_instances" FA_PERF_PATTERN='hsk=64,.*nr23=\[4,1\],kv=(32768|131072),nb=16,'
OPS_FA_PATTERN='hsk=64,.*type_V=turbo' VARIANT_NAME=wide128 g use-variant fa-perf ops-fa
g use-base fa-perf
VARIANT_NAME=nostage VARIANT_INSTANCES="$agents_instances" g use-variant fa-perf
VARIANT_INSTANCES="$agents_instances" g use-base
python3 scripts/fa_perf_table.py base=$o/fa-perf-base/perf.txt wide128=$o/fa-perf-wide128/perf.txt \
  nostage=$o/fa-perf-nostage/perf.txt > $o/fa-perf-hd64.md 2>&1
wait  # the random models
AGENTS=8,16,32 SHAPE=n_embd=2048,n_head=32,n_head_kv=8 AGENTS_KV=f16/f16,turbo3/turbo3 TAG=-hd64 g use-base agents
AGENTS=8,16,32 SHAPE=n_embd=2048,n_head=32,n_head_kv=8 AGENTS_KV=f16/f16,turbo3/turbo3 TAG=-hd64 VARIANT_NAME=wide128 g use-variant agents
g use-base
# 0097: q8_0 K converted for prompt batches, with it (base) and without (no0097)
export VARIANT_INSTANCES=convert.cu FA_PERF_PATTERN='nr23=\[[24],1\],kv=32768,nb=512,'
TAG=-pp g use-base fa-perf
PROMPTS=512 g use-base pp
VARIANT_NAME=no0097 TAG=-pp g use-variant fa-perf
PROMPTS=512 VARIANT_NAME=no0097 g use-variant pp
g use-base
python3 scripts/fa_perf_table.py base=$o/fa-perf-pp-base/perf.txt no0097=$o/fa-perf-pp-no0097/perf.txt > $o/fa-perf-0097.md 2>&1
# the kernel boundary at 3-4 queries: the decoding kernel from 3 on (vec2) against the vector kernel
export VARIANT_INSTANCES=fattn.cu FA_PERF_PATTERN='hsk=128,.*kv=(32768|131072),nb=4,'
TAG=-nb4 g use-base fa-perf
OPS_FA_PATTERN='nb=[34],.*type_V=turbo' VARIANT_NAME=vec2 TAG=-nb4 g use-variant fa-perf ops-fa
AGENTS=4 AGENTS_KV=f16/f16,turbo3/turbo3,q8_0/turbo3 TAG=-b4 VARIANT_NAME=vec2 g use-variant agents
AGENTS=4 AGENTS_KV=f16/f16,turbo3/turbo3,q8_0/turbo3 TAG=-b4 g use-base agents
python3 scripts/fa_perf_table.py base=$o/fa-perf-nb4-base/perf.txt vec2=$o/fa-perf-nb4-vec2/perf.txt > $o/fa-perf-vec2.md 2>&1
# what time is left: every fa-perf case, and single-sequence decode at the other head sizes
unset FA_PERF_PATTERN VARIANT_INSTANCES
TAG=-all g fa-perf
g heads
