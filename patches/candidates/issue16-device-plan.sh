#!/usr/bin/env bash
# Issue 16's device plan (../shared/device.md), after session l landed 0097 and 0099 and kept 0096 to head sizes 128
# and 256: prove the chain as it is now on the GPU, settle the 2-query boundary, then issue 16's table.
# Without .whl/prebuilt.tar.xz it builds, links the sides and packs them in /tmp/r9pack (bring the archive home in
# pieces: files back are at most 16 MiB each). .whl/prebuilt.tar.xz (key cuda-967d7e8b202b, made here in session l: `gpu_check.sh OUT pack` of the chain at e2defd1
# with this diff as BUILD_DIFF, sides base, vec1 (-DEXP_TURBO_VEC_MAX=1) and vec4 (=4, the boundary before 0099))
# lets the device build nothing; the tree's chain state does not matter then. Carry .whl/prebuilt.tar.xz,
# .whl/gguf-py.tar.xz and the three wheels (gitpython, gitdb, smmap). Without it, carry .whl whole: the device builds
# (about 340 s) and compiles the side. If the chain's CUDA code moves past e2defd1, pack a new archive first.
#   scripts/device_job.sh start r9 bash patches/candidates/issue16-device-plan.sh
#   scripts/device_job.sh poll r9 540        (again until DONE; a poll on a fresh machine exits 3 at once)
# Ordered by what a cut-short run must still have: correctness first.
set -u
o=/tmp/r9; mkdir -p $o
export BUILD_DIFF=patches/candidates/issue16-ab-hooks.diff
g() { bash scripts/gpu_check.sh $o "$@"; }
if [ -f .whl/prebuilt.tar.xz ]; then
  PREBUILT=.whl/prebuilt.tar.xz g prebuilt || exit 1
else
  g build || exit 1
  grep -q "build: exit 0" $o/summary.txt || exit 1
  VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec1 VARIANT_DEFS="-DEXP_TURBO_VEC_MAX=1" g variant > $o/variants.out 2>&1
  # both sides linked once, then packed beside the GPU work (one CPU core): a later fresh machine builds nothing
  VARIANT_INSTANCES=fattn.cu VARIANT_NAME=vec1 g use-variant use-base || exit 1
  ( bash scripts/gpu_check.sh /tmp/r9pack pack > /tmp/r9pack.log 2>&1; touch /tmp/r9pack.done ) &
  pack_pid=$!
fi
( export PYTHONPATH=/tmp/polyforge-site:$PWD POLYFORGE_CMAKE=$(command -v cmake) POLYFORGE_NINJA=$(command -v ninja)
  python3 -m polyforge models fetch "random:n_layer=16,n_embd=2048,n_head=16,n_head_kv=8,n_ff=5632,n_vocab=32000,n_ctx=140000" > $o/model.log 2>&1 ) &
export VARIANT_INSTANCES=fattn.cu
# the chain against the CPU: the turbo suite and every FA case
g use-base ops-turbo ops-fa
[ -z "${pack_pid:-}" ] || wait $pack_pid  # the use phases below swap bin/'s library
# 2 queries: the vector kernel (base) against the decoding kernel (vec1), one head size at a time
for hs in 64 256 512 128; do
  export FA_PERF_PATTERN="hsk=$hs,.*kv=(32768|131072),nb=2,.*type_K=(turbo3|q8_0)" TAG=-nb2-hd$hs
  g use-base fa-perf
  VARIANT_NAME=vec1 g use-variant fa-perf
  python3 scripts/fa_perf_table.py base=$o/fa-perf$TAG-base/perf.txt vec1=$o/fa-perf$TAG-vec1/perf.txt \
    > $o/fa-perf-vec1-hd$hs.md 2>&1
done
OPS_FA_PATTERN='nb=2,.*type_V=turbo' VARIANT_NAME=vec1 g use-variant ops-fa
unset FA_PERF_PATTERN TAG
g use-base
wait  # the random model
# issue 16's table on this chain: agents, single-sequence decode (886M hd128, then the other head sizes), prompts
g agents bench heads pp
