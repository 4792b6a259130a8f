#!/usr/bin/env bash
# The CUDA build of the vendored tree (the chain applied) on a host with nvcc and no GPU: proves the chain's CUDA
# code compiles and links for the target architecture before a GPU machine runs it. What such a host lacks is
# cuBLAS (the nvidia-cublas wheel from PyPI has it) and the driver's link stub: ggml-cuda calls a few driver API
# functions (the VMM pool), which a GPU machine's real driver answers at run time.
#
#   scripts/cuda_host_build.sh [more polyforge build arguments...]
#
# Reads CUDA_HOST_DEPS (where the wheel and the stub go, default /tmp/cuda-host-deps), CUBLAS_VERSION (default
# 13.10.0.20, CUDA 13), ARCH (default 90-real: SASS for sm_90 alone; `90` also embeds PTX, which an H100 or
# H200 never JIT-compiles) and TARGETS (default those gpu_check.sh build
# makes). Prints the build's JSON (its key) on stdout, as `polyforge build --json` does. With SHIP_OUT=FILE.tar.xz it
# also packs build/KEY/{manifest.json,bin} there, for `SHIP=FILE scripts/gpu_check.sh OUT build ...` on a GPU machine
# (a CUDA build in one call's upload instead of minutes of the GPU machine's time).
set -euo pipefail
deps=${CUDA_HOST_DEPS:-/tmp/cuda-host-deps}
py=${PYTHON:-python3}
targets=${TARGETS:-test-backend-ops llama-bench llama-batched-bench llama-perplexity llama-server}
cuda_src=vendor/llama.cpp/ggml/src/ggml-cuda
[ -d "$cuda_src" ] || { echo "cuda_host_build: no $cuda_src: run polyforge vendor fetch and apply first" >&2; exit 2; }
command -v nvcc > /dev/null || { echo "cuda_host_build: nvcc is not on PATH" >&2; exit 3; }

lib=$deps/cublas/nvidia/cu13/lib
if ! [ -f "$lib/libcublas.so.13" ]; then
  mkdir -p "$deps/cublas"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 -d "$deps/cublas" \
    "nvidia-cublas==${CUBLAS_VERSION:-13.10.0.20}" >&2
  ( cd "$deps/cublas" && unzip -qo nvidia_cublas-*.whl )
fi

# the stub exports every driver function the tree's ggml-cuda names, so it follows the tree
names=$(grep -ohE '\bcu(Device|Mem|Ctx|Get|Module|Launch|Stream|Init|Driver|Func|Event|Graph|Pointer)[A-Za-z0-9_]*\s*\(' \
  "$cuda_src"/*.cu "$cuda_src"/*.cuh | sed 's/[[:space:]]*($//' | sort -u)
stub=$deps/custub
mkdir -p "$stub"
for n in $names; do echo "int $n(void) { return 999; }"; done > "$stub/libcuda.c"
# soname libcuda.so.1, as the driver's: the executables resolve it through libggml-cuda's run path
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/libcuda.c"
ln -sfn libcuda.so "$stub/libcuda.so.1"
echo "cuda_host_build: driver stub of $(echo $names | wc -w) functions, cuBLAS from $lib" >&2

target_args=()
for t in $targets; do target_args+=(--target "$t"); done
# GGML_NATIVE=OFF: this host's -march=native is not the GPU machine's CPU, which runs test-backend-ops' CPU side
built=$("$py" -m polyforge build --cuda --arch "${ARCH:-90-real}" -D GGML_NATIVE=OFF "${target_args[@]}" \
  -D CUDA_cuda_driver_LIBRARY="$stub/libcuda.so" -D CUDA_cublas_LIBRARY="$lib/libcublas.so.13" \
  -D CUDA_cublasLt_LIBRARY="$lib/libcublasLt.so.13" -D CMAKE_CUDA_FLAGS="-I$lib/../include" --json "$@")
echo "$built"
if [ -n "${SHIP_OUT:-}" ]; then
  key=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["key"])' "$built")
  tar -C build -cJf "$SHIP_OUT" "$key/manifest.json" "$key/bin"
  echo "cuda_host_build: build $key packed into $SHIP_OUT" >&2
fi
