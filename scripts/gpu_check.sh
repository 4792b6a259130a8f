#!/usr/bin/env bash
# CUDA checks of the pinned tree with the chain on a GPU machine without network (the H200 of
# ../shared/device.md): vendor from a pack, apply, build, test-backend-ops against the CPU, bench.
# What travels in .whl/ (gitignored): llama.tar.xz from `polyforge vendor pack .whl/llama.tar.xz`,
# and gitpython, gitdb and smmap wheels (`pip download --no-deps --only-binary=:all: -d .whl ...`).
#
#   scripts/gpu_check.sh OUT PHASE...     PHASE: build | ops-turbo | ops-fa | bench | heads | pp | agents
#                                                | trace | ncu | kld | kscale | ops-hadamard | gates | needle
#                                                | before | variant | use-base | use-variant | tg
#                                                | agents-trace | agents-ncu | fa-perf | pack | prebuilt
#
# heads reads HEADS (default 64 256 512) and TAG: decode at depth 0, 32k and 128k on the GQA-4 shapes of
# issue 16 with those head sizes (16 layers; hd64 and hd256 at n_embd 2048, hd512 at 4096).
# before reads BEFORE (a patch, e.g. 0084): unapplies the chain down to it and rebuilds the build's
# llama-bench and llama-batched-bench in place (only what the newer patches touched recompiles); the phases
# after it write to folders ending in -before. An A/B on one machine, e.g. `OUT build heads before heads`:
# the build folder then holds the older chain under the newer key, so it is not one to keep.
# build reads BUILD_DIFF (a path under the repository): a device-only diff applied on top of the chain before
# building, e.g. an experiment behind a macro for the variant phase; the tree then differs from the chain.
# variant reads VARIANT_DEFS (nvcc flags, e.g. -DEXP_KNOB=1), VARIANT_INSTANCES (fattn-vec instances by their
# types, other instance files by their stems, e.g. fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2, ggml-cuda's own
# sources by file name, e.g. fattn.cu; default the
# six vector instances with turbo V; the use phases read it too) and VARIANT_NAME (default variant): it keeps the
# build's objects of those instances and compiles them once more with the flags, as that name. use-base and
# use-variant (the set named VARIANT_NAME) put one set into the build and relink the CUDA library by hand
# (ninja would compile a swapped-in object again from the tree: its deps-log entry is older than the
# object), write the library's md5 to the summary, and make later phases write to folders ending in -base or
# -NAME. An A/B of a compile-time knob on one machine, e.g. `OUT build variant use-base heads use-variant heads`;
# several knobs: one `variant` invocation per VARIANT_NAME, then `VARIANT_NAME=... OUT use-variant ...` each.
# tg reads TG_SHAPES (default 128: head sizes of the shapes above), TG_KV (default turbo3/turbo3), TG_DEPTHS
# (default 32768,131072), TG_ARGS (more llama-bench arguments) and TAG: decode only, llama-bench -n 32 -r 2, one
# line of t/s per shape and pair in tg.txt, tagged with the side in use: a quick A/B of one kernel.
# agents reads AGENTS (default 1,4,8,16,32), PREFIX (default 32768,131072), AGENTS_KV (default
# f16/f16,turbo3/turbo3,q8_0/turbo3), ROUNDS (default 1: medians
# of that many runs), SHAPE (attention dims of another random shape, e.g. n_embd=2048,n_head=32,n_head_kv=8;
# default the 886M's) and TAG (a suffix of its output folder), so that one scenario can be repeated under
# other settings.
# trace and ncu read DEPTH (default 131072), KV (default "f16/f16 turbo3/turbo3 q8_0/turbo3") and HD (the
# head size of the shape, default 128: the 886M): trace records a llama-bench decode with scripts/cupti_trace.c and splits it into steps
# (decode_trace_split.py: own and launch-to-end time per kernel), or with TRACE_PROMPT (e.g. 512) one prompt batch
# of that many tokens at DEPTH (the step after llama-bench saves the prefilled state); ncu profiles two launches of
# the vector FA kernel in the second decode step (ncu must be on PATH).
# agents-trace and agents-ncu do the same for llama-batched-bench's agents (AGENTS_B agents, default 16, sharing a
# DEPTH prefix, default 32768, -kvu -pps): the decode steps after the prefix's ubatches, and the third decode step's
# first tensor-core FA launch (ncu --set full; the SASS page with its stall samples as CSV).
# pp reads PROMPTS (default 16,32,64,512): prompt sizes at depth 0 and 32k.
# ops-fa reads OPS_FA_PATTERN (a params regex for test-backend-ops -p; default every FA case).
# fa-perf times the FA kernel alone (test-backend-ops perf) on the cases of FA_PERF_PATTERN (a params regex; default
# the long-context cases of issue 16's shapes: 1-512 queries, turbo3/turbo3 and q8_0/turbo3 against f16/f16) and
# tabulates them with scripts/fa_perf_table.py (fa-perf*/table.md; several sides: run the script on their perf.txt).
#
# kld reads KLD_MODELS (GGUF paths, space-separated): the turbo-kld protocol (ctx 1024, 12 chunks of
# the gate text, KLD to f16 K/V) on CUDA and on the CPU, and turbo3 without the key scale.
# kscale: decode of every turbo pair with and without the key scale (LLAMA_ATTN_K_SCALE_DISABLE=1).
# gates runs GATES (default shared-pool-turbo3-cuda) against the build; their models must already be in
# polyforge's model cache there (no PyPI: carry the GGUF in pieces and check its sha256).
# needle reads NEEDLE_MODEL (Gemma 3 270M GGUF), NEEDLE_SEEDS (default 18 19 20) and NEEDLE_N (default 16):
# gates/needle/gate_needle.py on CUDA and on the CPU (--device none), turbo keys with and without the scale.
#
# pack and prebuilt move the device's slowest step, the CUDA build (about 340 s cold there), to a host without a
# GPU: nvcc is enough there, with cuBLAS from the nvidia-cublas wheel (build -D CUDA_cublas_LIBRARY=...) and,
# where the toolkit has no lib64/stubs, a libcuda stub (-D CUDA_cuda_driver_LIBRARY=...). pack, on that host:
# the build's manifest, bin/ and the library sides the use phases linked (ab/lib-SIDE.so), as OUT/prebuilt.tar.xz
# under the build's own absolute path (its manifest and the binaries' run paths name it). prebuilt, on the GPU
# machine, reads PREBUILT (that archive) and BUILD_DIFF: vendors and applies as build does (or, without
# .whl/llama.tar.xz, which with the archive passes the 64 MiB carry limit, unpacks .whl/gguf-py.tar.xz, the tree's
# one part the phases read, which pack writes beside the archive), unpacks the archive
# at that path, links it in as build/KEY, and finds the machine's cuBLAS and CUDA runtime for the binaries
# (prebuilt.env in the build folder, read at the top of every later call). The use phases of a prebuilt build
# copy the side's linked library in; variant needs a build folder of its own.
#
# Each phase writes its log and a one-line summary under OUT; a failing step stops the phase.
set -u
out=${1:?usage: gpu_check.sh OUT PHASE...}; shift
mkdir -p "$out"
py=${PYTHON:-python3}
site=/tmp/polyforge-site
[ -d "$site" ] || "$py" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD"
# the machine's own cmake and ninja: no PyPI there
export POLYFORGE_CMAKE=${POLYFORGE_CMAKE:-$(command -v cmake)} POLYFORGE_NINJA=${POLYFORGE_NINJA:-$(command -v ninja)}
pf() { "$py" -m polyforge "$@"; }
key_file=build/gpu-check.key
# the random 16-layer llama shapes of issue 16, by their attention dimensions
random_model() { echo "random:n_layer=16,$1,n_ff=5632,n_vocab=32000,n_ctx=140000"; }
# the attention dimensions of issue 16's shape for a head size: the 886M at 128, GQA 4 at the others
head_shape() {
  case $1 in
    64)  echo n_embd=2048,n_head=32,n_head_kv=8 ;;
    128) echo n_embd=2048,n_head=16,n_head_kv=8 ;;
    256) echo n_embd=2048,n_head=8,n_head_kv=2 ;;
    512) echo n_embd=4096,n_head=8,n_head_kv=2 ;;
    *) echo "no shape for head size $1" >&2; return 1 ;;
  esac
}
model_886m=$(random_model "$(head_shape 128)")
model_file() { pf models fetch "$1" > /dev/null && pf models path "$1"; }
ops() { "build/$(cat $key_file)/bin/test-backend-ops" "$@"; }
# a prebuilt build's binaries find the machine's cuBLAS and CUDA runtime through this
[ -s $key_file ] && [ -f "build/$(cat $key_file)/prebuilt.env" ] && . "build/$(cat $key_file)/prebuilt.env"
# the tree a build compiles: the pinned pack vendored, the chain applied, BUILD_DIFF on top
prepare_tree() {
  pf vendor fetch --source .whl/llama.tar.xz --force > "$1" 2>&1 && pf apply >> "$1" 2>&1 &&
    { [ -z "${BUILD_DIFF:-}" ] || ( cd vendor/llama.cpp && git apply "$OLDPWD/$BUILD_DIFF" ) >> "$1" 2>&1; }
}
ab=  # "-before" after the before phase
variant_instances=${VARIANT_INSTANCES:-turbo2-turbo2 turbo3-turbo3 turbo4-turbo4 q8_0-turbo2 q8_0-turbo3 q8_0-turbo4}
variant_name=${VARIANT_NAME:-variant}
case $variant_name in base|*[!a-z0-9_]*) echo "VARIANT_NAME must be lowercase letters, digits or _, not base" >&2; exit 2 ;; esac
# a vector-kernel instance by its types (turbo3-turbo3), any other instance file by its stem (fattn-mma-f16-...),
# a source of ggml-cuda itself by its file name (fattn.cu: the kernel choice)
instance_obj() {
  local dir=ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir
  case $1 in
    *.cu) echo "$dir/$1.o" ;;
    fattn-*) echo "$dir/template-instances/$1.cu.o" ;;
    *) echo "$dir/template-instances/fattn-vec-instance-$1.cu.o" ;;
  esac
}
# scripts/cupti_trace.c built once per machine, for the trace phases
cupti_trace_lib() {
  [ -f /tmp/libcupti_trace.so ] && return
  local cupti_h cupti_so
  cupti_h=$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)
  cupti_so=$(find / -name 'libcupti.so*' 2>/dev/null | head -1)
  gcc -O2 -shared -fPIC -o /tmp/libcupti_trace.so scripts/cupti_trace.c -I"$(dirname "$cupti_h")" \
    -I"$(dirname "$(command -v nvcc)")/../include" -L"$(dirname "$cupti_so")" -lcupti -Wl,-rpath,"$(dirname "$cupti_so")"
}
summary() { echo "$1: $(grep -E '[0-9]+/[0-9]+ tests passed' "$2" | tail -1) (exit $3)" | tee -a "$out/summary.txt"; }

for phase in "$@"; do
  start=$(date +%s)
  case $phase in
    build)
      # 90-real: SASS alone, as the host build makes; with PTX too (90) pack's archive doubles, past the carry limit
      prepare_tree "$out/build.log" &&
        pf build --cuda --arch 90-real --target test-backend-ops --target llama-bench --target llama-batched-bench \
          --target llama-perplexity --target llama-server \
          --json > "$out/build.json" 2>> "$out/build.log"
      rc=$?
      "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['key'])" "$out/build.json" > $key_file 2>/dev/null
      # A/B objects of an earlier build under the same key are not this build's
      [ -s $key_file ] && rm -rf "build/$(cat $key_file)/ab"
      echo "build: exit $rc, key $(cat $key_file 2>/dev/null), $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt" ;;
    ops-turbo)  # the chain's types: set-rows (also fused with the rotation), copies, and FA with every turbo pair it builds
      for op in SET_ROWS CPY GET_ROWS HADAMARD_SET_ROWS; do
        ops -o $op -b CUDA0 -p turbo > "$out/ops-$op.log" 2>&1; summary "$op turbo" "$out/ops-$op.log" $?
      done
      ops -o FLASH_ATTN_EXT -b CUDA0 -p turbo > "$out/ops-fa-turbo.log" 2>&1
      summary "FLASH_ATTN_EXT turbo" "$out/ops-fa-turbo.log" $? ;;
    ops-fa)  # every FA case, or those of OPS_FA_PATTERN; on the side in place (after use-variant: ops-fa-SIDE.log)
      ops -o FLASH_ATTN_EXT -b CUDA0 ${OPS_FA_PATTERN:+-p "$OPS_FA_PATTERN"} > "$out/ops-fa$ab.log" 2>&1
      summary "FLASH_ATTN_EXT ${OPS_FA_PATTERN:-all}${ab:+ (${ab#-})}" "$out/ops-fa$ab.log" $? ;;
    fa-perf)
      tag=fa-perf${TAG:-}$ab
      mkdir -p "$out/$tag"
      ops perf -o FLASH_ATTN_EXT -b CUDA0 -p "${FA_PERF_PATTERN:-nr23=\[[24],1\],kv=(32768|131072),}" > "$out/$tag/perf.txt" 2>&1
      rc=$?
      "$py" scripts/fa_perf_table.py "${tag#fa-perf-}=$out/$tag/perf.txt" > "$out/$tag/table.md" 2>> "$out/$tag/perf.txt"
      echo "$tag: exit $rc, $(grep -c 'us/run' "$out/$tag/perf.txt") timed cases, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt" ;;
    bench)  # the 886M hd128 shape of shared/measurements.md: decode at depth 0, 32k, 128k
      pf bench --build "$(cat $key_file)" -m "$model_886m" \
        --kv f16/f16,turbo3/turbo3,q8_0/turbo3 -d 0,32768,131072 --flags '-fa 1 -ngl 99' -n 64 -r 2 \
        --bandwidth 4800 --out "$out/bench$ab" > "$out/bench$ab.log" 2>&1
      echo "bench: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt" ;;
    heads)
      for hd in ${HEADS:-64 256 512}; do
        shape=$(head_shape $hd) || continue
        tag=hd$hd${TAG:-}$ab
        pf bench --build "$(cat $key_file)" -m "$(random_model "$shape")" \
          --kv f16/f16,turbo3/turbo3,q8_0/turbo3 -d 0,32768,131072 --flags '-fa 1 -ngl 99' -n 32 -r 2 \
          --bandwidth 4800 --out "$out/$tag" > "$out/$tag.log" 2>&1
        echo "$tag: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      done ;;
    pp)  # prompt processing at depth 0 and 32k, same model; batches on both sides of 0083's switch (32 queries)
      pf bench --build "$(cat $key_file)" -m "$model_886m" \
        --kv f16/f16,turbo3/turbo3,q8_0/turbo3 -d 0,32768 --flags '-fa 1 -ngl 99' -p "${PROMPTS:-16,32,64,512}" -n 0 -r 2 \
        --out "$out/pp$ab" > "$out/pp$ab.log" 2>&1
      echo "pp: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt" ;;
    agents)  # B agents sharing a 32k or 128k prefix (the pool's case), same model
      tag=agents${TAG:-}$ab
      model=$model_886m; [ -n "${SHAPE:-}" ] && model=$(random_model "$SHAPE")
      pf bench --build "$(cat $key_file)" -m "$model" --agents "${AGENTS:-1,4,8,16,32}" \
        --prefix "${PREFIX:-32768,131072}" --kv "${AGENTS_KV:-f16/f16,turbo3/turbo3,q8_0/turbo3}" -n 64 --rounds "${ROUNDS:-1}" \
        --out "$out/$tag" > "$out/$tag.log" 2>&1
      echo "$tag: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt" ;;
    kld)
      ppl() { "build/$(cat $key_file)/bin/llama-perplexity" -m "$1" -f gates/data/llama-docs.txt -c 1024 --chunks 12 -fa on "${@:2}"; }
      for m in ${KLD_MODELS:?}; do
        name=$(basename "$m" .gguf)
        for dev in cuda cpu; do
          [ $dev = cuda ] && ngl=99 || ngl=0
          base="$out/kld-$name-$dev.base"
          ppl "$m" -ngl $ngl --kl-divergence-base "$base" > "$out/kld-$name-$dev.log" 2>&1
          for kv in q4_0/q4_0 q8_0/q4_0 q8_0/turbo4 q8_0/turbo3 turbo4/turbo4 turbo3/turbo3 turbo2/turbo2 turbo3/turbo3-noscale; do
            k=${kv%%/*}; v=${kv#*/}; v=${v%-noscale}; env=(); [ "${kv%-noscale}" != "$kv" ] && env=(LLAMA_ATTN_K_SCALE_DISABLE=1)
            env "${env[@]}" "build/$(cat $key_file)/bin/llama-perplexity" -m "$m" -f gates/data/llama-docs.txt -c 1024 --chunks 12 -fa on \
              -ngl $ngl -ctk $k -ctv $v --kl-divergence-base "$base" --kl-divergence >> "$out/kld-$name-$dev.log" 2>&1
            echo "kld $name $dev $kv: $(grep -E 'Mean +KLD' "$out/kld-$name-$dev.log" | tail -1 | awk '{print $3}') top1 $(grep 'Same top p' "$out/kld-$name-$dev.log" | tail -1 | awk '{print $4}')" | tee -a "$out/summary.txt"
          done
          rm -f "$base"
        done
      done ;;
    kscale)  # same model as bench; today's build is the same binary with the scale turned off
      # KSCALE_DEPTHS (default 0,32768,131072), KSCALE_ROUNDS (default 1): on and off alternate;
      # KSCALE_PROMPTS (default 0: none): prompt sizes too; at depth 0 each is a calibration step (with
      # KSCALE_DEPTHS=0 the calibration's one-off cost: on against off)
      for round in $(seq 1 "${KSCALE_ROUNDS:-1}"); do
        for scale in on off; do
          [ $scale = off ] && export LLAMA_ATTN_K_SCALE_DISABLE=1 || unset LLAMA_ATTN_K_SCALE_DISABLE
          pf bench --build "$(cat $key_file)" -m "$model_886m" \
            --kv turbo3/turbo3,turbo4/turbo4,turbo2/turbo2,q8_0/turbo3,q8_0/turbo4 -d "${KSCALE_DEPTHS:-0,32768,131072}" \
            --flags '-fa 1 -ngl 99' -p "${KSCALE_PROMPTS:-0}" -n 128 -r 3 --out "$out/kscale-$scale-$round" \
            > "$out/kscale-$scale-$round.log" 2>&1
          echo "kscale $scale round $round: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
        done
      done
      unset LLAMA_ATTN_K_SCALE_DISABLE ;;
    trace|ncu)  # one decode step's kernels (trace) / the FA kernel's counters (ncu), same model, at DEPTH
      model=$(model_file "$(random_model "$(head_shape ${HD:-128})")") || exit 1
      bench_bin="build/$(cat $key_file)/bin/llama-bench"
      bench_args=(-m "$model" -d "${DEPTH:-131072}" -fa 1 -ngl 99 -r 1 --no-warmup)
      [ $phase = trace ] && { cupti_trace_lib || exit 1; }
      # decode: 8 tokens, the first 2 steps left out; a prompt batch: the one step after the state's save, which no
      # later input copy ends
      trace_run=(-p 0 -n 8) trace_split=(--skip 2)
      [ -n "${TRACE_PROMPT:-}" ] && trace_run=(-p "$TRACE_PROMPT" -n 0) trace_split=(--skip 0 --keep-last)
      for kv in ${KV:-f16/f16 turbo3/turbo3 q8_0/turbo3}; do
        tag=$phase${HD:+-hd$HD}${TRACE_PROMPT:+-pp$TRACE_PROMPT}-${kv/\//-}$ab
        if [ $phase = trace ]; then
          CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so CUPTI_TRACE_OUT="$out/$tag.csv" \
            "$bench_bin" "${bench_args[@]}" "${trace_run[@]}" -ctk ${kv%/*} -ctv ${kv#*/} > "$out/$tag.log" 2>&1
          "$py" scripts/decode_trace_split.py "$out/$tag.csv" "$kv" "${trace_split[@]}" --top 16 > "$out/$tag.txt" 2>> "$out/$tag.log"
          rc=$?; xz -f "$out/$tag.csv"
        else  # the second decode step's first two FA launches (the vector kernel decodes one token)
          ncu -f -o "$out/$tag" --kernel-name regex:flash_attn_ext_vec --launch-skip 16 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section Occupancy --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \
            "$bench_bin" "${bench_args[@]}" -p 0 -n 2 -ctk ${kv%/*} -ctv ${kv#*/} > "$out/$tag.log" 2>&1
          rc=$?; ncu --import "$out/$tag.ncu-rep" --page details > "$out/$tag.txt" 2>> "$out/$tag.log"
        fi
        echo "$tag: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      done ;;
    agents-trace|agents-ncu)  # one agents decode step (trace) / its FA kernel's counters (ncu): B agents sharing a DEPTH prefix
      model=$(model_file "$(random_model "$(head_shape ${HD:-128})")") || exit 1
      depth=${DEPTH:-32768} nb=${AGENTS_B:-16}
      bb_args=(-m "$model" -c $((depth + 16*nb + 256)) -npp $depth -npl $nb -pps -kvu -fa on -ngl 99 -b 2048 -ub 512)
      # before the decode steps: the warm-up and the prefix's ubatches of 512 (each a "step" of the split)
      prefill_steps=$(( (depth + 511) / 512 + 1 ))
      [ $phase = agents-trace ] && { cupti_trace_lib || exit 1; }
      for kv in ${KV:-f16/f16 turbo3/turbo3}; do
        tag=$phase${HD:+-hd$HD}-b$nb-d$depth-${kv/\//-}$ab
        if [ $phase = agents-trace ]; then
          CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so CUPTI_TRACE_OUT="$out/$tag.csv" \
            "build/$(cat $key_file)/bin/llama-batched-bench" "${bb_args[@]}" -ntg 16 -ctk ${kv%/*} -ctv ${kv#*/} > "$out/$tag.log" 2>&1
          "$py" scripts/decode_trace_split.py "$out/$tag.csv" "$kv B=$nb" --all-steps --skip $((prefill_steps + 2)) --top 16 > "$out/$tag.txt" 2>> "$out/$tag.log"
          rc=$?; xz -f "$out/$tag.csv"
        else  # the third decode step's first FA launch (16 layers a step)
          ncu -f -o "$out/$tag" --kernel-name regex:flash_attn_ext_f16 --launch-skip $(( (prefill_steps + 2) * 16 )) --launch-count 1 \
            --set full --import-source no "build/$(cat $key_file)/bin/llama-batched-bench" "${bb_args[@]}" -ntg 4 \
            -ctk ${kv%/*} -ctv ${kv#*/} > "$out/$tag.log" 2>&1
          rc=$?; ncu --import "$out/$tag.ncu-rep" --page details > "$out/$tag.txt" 2>> "$out/$tag.log"
          ncu --import "$out/$tag.ncu-rep" --page source --csv --print-source sass 2>> "$out/$tag.log" | xz > "$out/$tag.sass.csv.xz"
        fi
        echo "$tag: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      done ;;
    tg)
      for hd in ${TG_SHAPES:-128}; do
        model=$(model_file "$(random_model "$(head_shape $hd)")") || exit 1
        for kv in ${TG_KV:-turbo3/turbo3}; do
          tag=tg-hd$hd-${kv/\//-}${TAG:-}$ab
          "build/$(cat $key_file)/bin/llama-bench" -m "$model" -p 0 -n 32 -d "${TG_DEPTHS:-32768,131072}" -fa 1 -ngl 99 \
            -r 2 -ctk ${kv%/*} -ctv ${kv#*/} ${TG_ARGS:-} -o jsonl > "$out/$tag.jsonl" 2> "$out/$tag.log"
          rc=$?
          ts=$("$py" -c 'import json, sys
print(" ".join("d%s %.1f" % (r.get("n_depth", "?"), r["avg_ts"]) for r in map(json.loads, open(sys.argv[1]))))' "$out/$tag.jsonl")
          echo "$tag: exit $rc, t/s $ts" | tee -a "$out/tg.txt" "$out/summary.txt"
        done
      done ;;
    ops-hadamard)  # the FWHT mul_mat hints, plain and scaled (0081's per-KV-head rotation)
      ops -o MUL_MAT_HADAMARD,MUL_MAT_SCALED_HADAMARD -b CUDA0 > "$out/ops-hadamard.log" 2>&1
      summary "MUL_MAT HADAMARD" "$out/ops-hadamard.log" $? ;;
    gates)
      for g in ${GATES:-shared-pool-turbo3-cuda}; do
        pf gate run "$g" --build "$(cat $key_file)" --json > "$out/gate-$g.json" 2> "$out/gate-$g.log"
        echo "gate $g: exit $?, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      done ;;
    needle)  # one server per K/V pair; found = needles whose code the greedy answer starts with
      for dev in cuda cpu; do
        [ $dev = cuda ] && extra="-ngl 99" || extra="--device none -t $(nproc)"
        for seed in ${NEEDLE_SEEDS:-18 19 20}; do
          for scale in on off; do
            kv=(--kv turbo3/turbo3 --kv turbo4/turbo4); env=()
            [ $scale = on ] && kv+=(--kv f16/f16 --kv q8_0/turbo3) || env=(LLAMA_ATTN_K_SCALE_DISABLE=1)
            f="$out/needle-$dev-$scale-$seed"
            env "${env[@]}" "$py" gates/needle/gate_needle.py --server "build/$(cat $key_file)/bin/llama-server" \
              --model "${NEEDLE_MODEL:?}" --text gates/data/llama-docs.txt --needles "${NEEDLE_N:-16}" --seed "$seed" \
              "${kv[@]}" --extra-args "$extra" --json > "$f.json" 2> "$f.log"
            echo "needle $dev scale $scale seed $seed: $("$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%s %d/%d" % (k, v["found"], d["needles"]) for k, v in d.items() if isinstance(v, dict)))' "$f.json" 2>&1)" | tee -a "$out/summary.txt"
          done
        done
      done ;;
    before)
      pf unapply --to "${BEFORE:?before needs BEFORE=NNNN}" > "$out/before.log" 2>&1 &&
        "$POLYFORGE_NINJA" -C "build/$(cat $key_file)" llama-bench llama-batched-bench >> "$out/before.log" 2>&1
      rc=$?
      ab=-before; rm -rf "build/$(cat $key_file)/ab"
      echo "before $BEFORE: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      [ $rc = 0 ] || exit 1 ;;
    variant)
      : "${VARIANT_DEFS:?variant needs VARIANT_DEFS}"
      B=build/$(cat $key_file); mkdir -p "$B/ab"
      for t in $variant_instances; do
        # the base objects are the build's own: kept once, before any variant is swapped in
        [ -f "$B/ab/base-$t.o" ] || cp "$B/$(instance_obj $t)" "$B/ab/base-$t.o" || exit 1
        # the build's compile line with the flags added after the compiler and the output moved aside
        cmd=$(cd "$B" && "$POLYFORGE_NINJA" -t commands "$(instance_obj $t)" | tail -1)
        cmd=$(echo "$cmd" | sed -e "s# -o [^ ]*# -o ab/$variant_name-$t.o#" -e "s# -MF [^ ]*# -MF ab/$variant_name-$t.d#" \
          -e "s#\([^ ]*nvcc[^ ]*\) #\1 $VARIANT_DEFS #")
        ( cd "$B" && eval "$cmd" ) > "$out/$variant_name-$t.log" 2>&1 &
      done
      wait
      rc=0
      for t in $variant_instances; do [ -f "$B/ab/$variant_name-$t.o" ] || { rc=1; tail -5 "$out/$variant_name-$t.log"; }; done
      echo "$variant_name ${VARIANT_DEFS}: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      [ $rc = 0 ] || exit 1 ;;
    use-base|use-variant)
      side=${phase#use-}; [ $side = variant ] && side=$variant_name
      B=build/$(cat $key_file)
      lib=$(cd "$B" && ls bin/libggml-cuda.so.*.*.* | head -1)
      if [ -f "$B/build.ninja" ]; then
        # every object any variant swapped: the side's own where it has one, else the build's, so that a side never
        # keeps another variant's objects (r11's base kept vec1's fattn.cu after a kblock swap of other instances)
        for t in $variant_instances; do [ -f "$B/ab/$side-$t.o" ] || { echo "use $side: no $t" >&2; exit 1; }; done
        for f in "$B"/ab/base-*.o; do
          t=${f##*/base-}; t=${t%.o}
          if [ -f "$B/ab/$side-$t.o" ]; then cp "$B/ab/$side-$t.o" "$B/$(instance_obj $t)"; else cp "$f" "$B/$(instance_obj $t)"; fi || exit 1
        done
        link=$(cd "$B" && "$POLYFORGE_NINJA" -t commands "$lib" | tail -1)
        ( cd "$B" && eval "$link" ) > "$out/relink-$side.log" 2>&1 &&
          cp "$B/$lib" "$B/ab/lib-$side.so"  # this side linked, for pack
      else  # prebuilt: the side came linked
        cp "$B/ab/lib-$side.so" "$B/$lib"
      fi
      rc=$?
      ab=-$side
      echo "use $side: exit $rc, libggml-cuda md5 $(md5sum < "$B/$lib" | cut -c1-12)" | tee -a "$out/summary.txt"
      [ $rc = 0 ] || exit 1 ;;
    pack)
      B=$(realpath "build/$(cat $key_file)")
      [ -f "$B/manifest.json" ] || { echo "pack: $B is not a finished build" >&2; exit 1; }
      # one xz stream with a window larger than a library: the sides differ in a few objects and pack to little more
      ( cd "$B" && ls manifest.json; find bin -maxdepth 1 \( -type f -o -type l \); ls ab/lib-*.so 2>/dev/null ) |
        sed "s#^#${B#/}/#" | tar -C / -cf - -T - | xz -6 --lzma2=preset=6,dict=512MiB -T1 > "$out/prebuilt.tar.xz"
      rc=$?
      # the one part of the tree the phases read when the pinned pack stays home (the carry limit): random models' gguf-py
      [ $rc = 0 ] && tar -C vendor/llama.cpp -cJf "$out/gguf-py.tar.xz" --exclude=__pycache__ gguf-py
      rc=$?
      echo "pack: exit $rc, $(du -m "$out/prebuilt.tar.xz" | cut -f1) MB, sides: $(cd "$B" && ls ab/lib-*.so 2>/dev/null | tr '\n' ' ')" |
        tee -a "$out/summary.txt" ;;
    prebuilt)
      if [ -f .whl/llama.tar.xz ]; then
        prepare_tree "$out/prebuilt.log"
      else  # the pinned pack did not travel: gguf-py alone, from pack
        rm -rf vendor/llama.cpp/gguf-py && mkdir -p vendor/llama.cpp && tar -C vendor/llama.cpp -xJf .whl/gguf-py.tar.xz
      fi && tar -C / -xvJf "${PREBUILT:?prebuilt needs PREBUILT=archive}" > "$out/prebuilt.files" 2>> "$out/prebuilt.log"
      rc=$?
      dir=/$(grep -m1 'manifest.json$' "$out/prebuilt.files" | sed 's#/manifest.json$##')
      key=$(basename "$dir")
      if [ $rc = 0 ] && [ -f "$dir/manifest.json" ]; then
        mkdir -p build
        [ "$(realpath "build/$key" 2>/dev/null)" = "$dir" ] || ln -sfn "$dir" "build/$key"
        echo "$key" > $key_file
        libdirs=
        for so in libcublas.so.13 libcudart.so.13; do
          found=$(find /usr/local /usr/lib /usr/lib64 /opt -name "$so" 2>/dev/null | head -1)
          [ -n "$found" ] && libdirs=$libdirs${libdirs:+:}$(dirname "$found")
        done
        echo "export LD_LIBRARY_PATH=$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" > "$dir/prebuilt.env"
        . "$dir/prebuilt.env"
        missing=$(ldd "$dir/bin/test-backend-ops" "$dir/bin/libggml-cuda.so" | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
        [ -z "$missing" ] || { rc=1; echo "prebuilt: libraries not found: $missing" >> "$out/prebuilt.log"; }
      else
        rc=1
      fi
      echo "prebuilt: exit $rc, key $key, libraries from ${libdirs:-?}, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
      [ $rc = 0 ] || exit 1 ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
