#!/usr/bin/env bash
# The chain's CUDA checks on a machine with an NVIDIA GPU: build, correctness against the CPU, the CUDA gates,
# speed. Every step is a polyforge verb or a llama.cpp tool of the build; the figures of docs/performance.md come
# from these steps.
#
#   scripts/gpu_check.sh OUT STEP...
#
#   build    polyforge build --cuda of the vendored tree with the chain applied (ARCH, default 90-real: SASS for
#            sm_90 alone). With PACK (an archive of `polyforge vendor pack --full`) it first vendors from that
#            archive and applies the chain: a machine without network. With SHIP (an archive of a build made on
#            another host, `SHIP_OUT=... scripts/cuda_host_build.sh`) it unpacks that build instead of compiling, and
#            PACK (then a plain or --full pack of the baseline) is only vendored, for the random models' gguf-py.
#   ops      test-backend-ops -b CUDA0 against the CPU: the turbo K/V ops (SET_ROWS, CPY, GET_ROWS,
#            HADAMARD_SET_ROWS, FLASH_ATTN_EXT with turbo K or V) and the Hadamard mul_mat hints (0082)
#   ops-fa   every FLASH_ATTN_EXT case (a few minutes)
#   package  polyforge package of the build and package --verify; then, with build/ moved aside (no build tree),
#            llama-server --version from the unpacked archive
#   gates    polyforge gate run GATE --build KEY for each of GATES (default: the CUDA gates); their models must
#            be in polyforge's model cache already where there is no network
#   bench    single-sequence decode, f16/f16, turbo3/turbo3 and q8_0/turbo3 at depth 0, 32k and 128k, on the
#            random 16-layer shape of each head size in HEADS (default 128, the 886M shape; 64 256 512: GQA 4)
#   pp       pp512 at depth 0 and 32k, the same pairs, the 886M shape
#   agents   B = 1, 4, 8, 16, 32 agents sharing a 32k and a 128k prefix (llama-batched-bench -pps -kvu), decode
#            t/s per pair, ROUNDS runs (default 1; more give medians and the ratios' range)
#   fa-perf  the FA kernel alone (test-backend-ops perf) on the long-context cases of 0085, as a table of speed
#            against f16/f16 and q8_0/q8_0 (scripts/fa_perf_table.py; with a numeric BANDWIDTH, each row's share)
#   trace    one decode step's kernels at DEPTH (default 131072) on the shape of HEADS' first head size, per K/V
#            pair (scripts/cupti_trace.c, scripts/decode_trace_split.py; scripts/attention_ceiling.py --trace
#            reads the f16 side's CSV)
#
# BANDWIDTH (GB/s; default auto, measured on the GPU by bench) is what each decode row's fraction of the
# bandwidth divides by (fa-perf: a number only). WHEELS (a folder of wheels, default .whl) is installed without network when polyforge's dependencies are missing.
# Each step writes its logs under OUT and one line to OUT/summary.txt; a failing build stops the run.
set -u
out=${1:?usage: gpu_check.sh OUT STEP...}; shift
mkdir -p "$out"
py=${PYTHON:-python3}
if ! "$py" -c 'import git' 2> /dev/null && ls "${WHEELS:-.whl}"/*.whl > /dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --target /tmp/polyforge-site "${WHEELS:-.whl}"/*.whl
  export PYTHONPATH=/tmp/polyforge-site:$PWD
fi
# the machine's own cmake and ninja
export POLYFORGE_CMAKE=${POLYFORGE_CMAKE:-$(command -v cmake)} POLYFORGE_NINJA=${POLYFORGE_NINJA:-$(command -v ninja)}
pf() { "$py" -m polyforge "$@"; }
key_file=build/gpu-check.key
key() { cat $key_file; }
bin() { echo "build/$(key)/bin/$1"; }
pairs=f16/f16,turbo3/turbo3,q8_0/turbo3
# the random 16-layer llama shapes, by head size: the 886M at 128 (GQA 2), GQA 4 at the others
shape() {
  case $1 in
    64)  echo n_embd=2048,n_head=32,n_head_kv=8 ;;
    128) echo n_embd=2048,n_head=16,n_head_kv=8 ;;
    256) echo n_embd=2048,n_head=8,n_head_kv=2 ;;
    512) echo n_embd=4096,n_head=8,n_head_kv=2 ;;
    *) echo "no shape for head size $1" >&2; return 1 ;;
  esac
}
model() { echo "random:n_layer=16,$(shape "$1"),n_ff=5632,n_vocab=32000,n_ctx=140000"; }
note() { echo "$1" | tee -a "$out/summary.txt"; }
# "NAME: N/M tests passed (exit RC)" from a test-backend-ops log
ops() {
  local name=$1 log=$2; shift 2
  "$(bin test-backend-ops)" "$@" -b CUDA0 > "$log" 2>&1
  local rc=$?
  note "$name: $(grep -oE '[0-9]+/[0-9]+ tests passed' "$log" | tail -1) (exit $rc)"
}

for step in "$@"; do
  start=$(date +%s)
  case $step in
    build)
      if [ -n "${SHIP:-}" ]; then
        { [ -z "${PACK:-}" ] || pf vendor fetch --source "$PACK" --force; } > "$out/build.log" 2>&1 &&
          mkdir -p build && tar -xJf "$SHIP" -C build >> "$out/build.log" 2>&1
        rc=$?
        shipped=$(tar -tJf "$SHIP" 2> /dev/null | head -1); shipped=${shipped%%/*}
        echo "$shipped" > $key_file
        # the manifest names the folder it was built in; the binaries find each other through RUNPATH $ORIGIN,
        # CUDA's libraries through this machine's toolkit (or the CUDA wheels of its Python)
        [ $rc = 0 ] && "$py" -c 'import json, sys; p = sys.argv[1]; m = json.load(open(p)); m["build_dir"] = sys.argv[2]
json.dump(m, open(p, "w"), indent=1)' "build/$shipped/manifest.json" "$PWD/build/$shipped" >> "$out/build.log" 2>&1
        rc=$(( rc || $? ))
        cuda_libs=$(find /usr/local /opt /usr/lib \( -name 'libcublas.so.*' -o -name 'libcudart.so.*' \) 2> /dev/null |
          xargs -r -n1 dirname | sort -u | tr '\n' ':')
        export LD_LIBRARY_PATH=$cuda_libs${LD_LIBRARY_PATH:-}
        note "build: shipped $(key), unpacked: exit $rc, $(( $(date +%s) - start )) s"
        [ $rc = 0 ] || exit 1
        continue
      fi
      { [ -z "${PACK:-}" ] || { pf vendor fetch --source "$PACK" --force && pf apply; } > "$out/build.log" 2>&1; } &&
        pf build --cuda --arch "${ARCH:-90-real}" --target test-backend-ops --target llama-bench \
          --target llama-batched-bench --target llama-perplexity --target llama-server --json \
          > "$out/build.json" 2>> "$out/build.log"
      rc=$?
      mkdir -p build
      "$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["key"])' "$out/build.json" > $key_file 2> /dev/null
      note "build: exit $rc, key $(key), $(( $(date +%s) - start )) s"
      [ $rc = 0 ] || exit 1 ;;
    ops)
      for op in SET_ROWS CPY GET_ROWS HADAMARD_SET_ROWS FLASH_ATTN_EXT; do
        ops "$op turbo" "$out/ops-$op.log" -o $op -p turbo
      done
      ops "MUL_MAT_HADAMARD, MUL_MAT_SCALED_HADAMARD" "$out/ops-hadamard.log" -o MUL_MAT_HADAMARD,MUL_MAT_SCALED_HADAMARD ;;
    ops-fa)
      ops "FLASH_ATTN_EXT" "$out/ops-fa.log" -o FLASH_ATTN_EXT ;;
    gates)
      for g in ${GATES:-backend-ops-cuda mtp-cuda shared-pool-turbo3-cuda}; do
        pf gate run "$g" --build "$(key)" --json > "$out/gate-$g.json" 2> "$out/gate-$g.log"
        note "gate $g: exit $?"
      done ;;
    bench)
      for hd in ${HEADS:-128}; do
        pf bench --build "$(key)" -m "$(model "$hd")" --kv $pairs -d 0,32768,131072 --flags '-fa 1 -ngl 99' \
          -n 64 -r 2 --bandwidth "${BANDWIDTH:-auto}" --out "$out/bench-hd$hd" > "$out/bench-hd$hd.log" 2>&1
        note "bench hd$hd: exit $?, $(( $(date +%s) - start )) s"
      done ;;
    pp)
      pf bench --build "$(key)" -m "$(model 128)" --kv $pairs -d 0,32768 --flags '-fa 1 -ngl 99' -p 512 -n 0 -r 2 \
        --out "$out/pp" > "$out/pp.log" 2>&1
      note "pp: exit $?, $(( $(date +%s) - start )) s" ;;
    agents)
      pf bench --build "$(key)" -m "$(model 128)" --agents 1,4,8,16,32 --prefix 32768,131072 --kv $pairs -n 64 \
        --rounds "${ROUNDS:-1}" --out "$out/agents" > "$out/agents.log" 2>&1
      note "agents: exit $?, $(( $(date +%s) - start )) s" ;;
    fa-perf)
      "$(bin test-backend-ops)" perf -o FLASH_ATTN_EXT -b CUDA0 -p 'nr23=\[[1-8],1\],kv=(32768|131072),' \
        > "$out/fa-perf.txt" 2>&1
      rc=$?
      bw_arg=(); [[ ${BANDWIDTH:-auto} =~ ^[0-9]+([.][0-9]+)?$ ]] && bw_arg=(--bandwidth "$BANDWIDTH")
      "$py" scripts/fa_perf_table.py "${bw_arg[@]}" "$out/fa-perf.txt" > "$out/fa-perf.md" 2>> "$out/fa-perf.txt"
      note "fa-perf: exit $rc, $(grep -c 'us/run' "$out/fa-perf.txt") timed cases" ;;
    trace)
      hd=${HEADS:-128}; hd=${hd%% *}
      gguf=$(pf models fetch "$(model "$hd")" > /dev/null && pf models path "$(model "$hd")") || exit 1
      if ! [ -f /tmp/libcupti_trace.so ]; then
        cupti_h=$(find / -name cupti.h -path '*include*' 2> /dev/null | head -1)
        cupti_so=$(find / -name 'libcupti.so*' 2> /dev/null | head -1)
        gcc -O2 -shared -fPIC -o /tmp/libcupti_trace.so scripts/cupti_trace.c -I"$(dirname "$cupti_h")" \
          -I"$(dirname "$(command -v nvcc)")/../include" -L"$(dirname "$cupti_so")" -lcupti \
          -Wl,-rpath,"$(dirname "$cupti_so")" || exit 1
      fi
      for kv in ${pairs//,/ }; do
        tag=trace-hd$hd-${kv/\//-}
        # 8 tokens decoded after the prefilled state; the first 2 steps left out
        CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so CUPTI_TRACE_OUT="$out/$tag.csv" "$(bin llama-bench)" -m "$gguf" \
          -d "${DEPTH:-131072}" -p 0 -n 8 -fa 1 -ngl 99 -r 1 --no-warmup -ctk ${kv%/*} -ctv ${kv#*/} > "$out/$tag.log" 2>&1
        "$py" scripts/decode_trace_split.py "$out/$tag.csv" "$kv" --skip 2 --top 16 > "$out/$tag.txt" 2>> "$out/$tag.log"
        note "$tag: exit $?"
      done ;;
    package)
      pf package --build "$(key)" --json > "$out/package.json" 2> "$out/package.log"
      rc=$?
      archive=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["archive"])' "$out/package.json" 2> /dev/null)
      pf package --verify "$archive" >> "$out/package.log" 2>&1
      verify=$?
      unpacked=$(mktemp -d)
      tar -xf "$archive" -C "$unpacked" 2>> "$out/package.log" && mv build "$out/build-away" &&
        "$unpacked"/*/bin/llama-server --version >> "$out/package.log" 2>&1
      version=$?
      [ -d "$out/build-away" ] && mv "$out/build-away" build
      rm -rf "$unpacked"
      note "package: exit $rc, verify exit $verify, llama-server --version from the unpacked archive: exit $version, $(( $(date +%s) - start )) s" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
