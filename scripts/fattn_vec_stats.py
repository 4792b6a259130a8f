#!/usr/bin/env python3
"""Static statistics of the CUDA flash-attention vector kernels of the vendored tree, without a GPU.

Compiles one template-instance file (ggml/src/ggml-cuda/template-instances/fattn-vec-instance-NAME.cu)
with the local nvcc for one architecture and prints, per flash_attn_ext_vec kernel: registers, stack,
spills (ptxas -v), SASS instructions in all and in the main K/V loop (the longest backward branch before
the kernel's exit), local loads/stores in that loop (spills or arrays the compiler could not keep in
registers), and the global loads issued before and after the loop's first shared store (the KQ values:
V loads after it wait for the K dot products).

  fattn_vec_stats.py turbo3-turbo3 [--filter 'D=256'] [-D NAME=VALUE ...] [--arch 90] [--keep DIR]

With an instance file of the tensor-core kernel instead (a name starting with fattn-mma-f16, e.g.
fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2, with -D GGML_CUDA_FA_TURBO3_TURBO3=1 for the kv-dec ones, as
the build defines it for each enabled turbo pair), it prints per flash_attn_ext_f16 kernel: registers, stack,
spills, SASS instructions, and its KV-tile iterations: the innermost loops with tensor-core instructions (the
kernel has one per peeled variant of the iteration), their sizes, HMMA, global loads (LDG), asynchronous copies
(LDGSTS) and shared stores (STS) of the largest.

Both tables end with "rolled": the sizes of the loops the compiler kept inside the main loop (the largest tile
loop). The loop's count holds each of their bodies once, whatever their trip count, so there a trip executes more
than the count says (the decode loops of a 128-row kv_dec tile at D=128, the V loop unrolled by 4 at D=512).

nvcc must be on PATH. cuobjdump (and the nvdisasm it runs) come from PATH, --cuobjdump, or PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (downloaded once into ~/.cache/polyforge/tools).
cuBLAS headers are not needed: a stub stands in.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

from polyforge import proc
from polyforge.project import cache_dir

ROOT = Path(__file__).resolve().parents[1]

# the declarations of cublas_v2.h that ggml-cuda's headers use; the kernels never call them
CUBLAS_STUB = """#pragma once
typedef struct cublasContext * cublasHandle_t;
typedef int cublasStatus_t;
typedef int cublasMath_t;
typedef int cublasComputeType_t;
typedef int cublasGemmAlgo_t;
typedef int cublasOperation_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_TF32_TENSOR_OP_MATH 0
#define CUBLAS_DEFAULT_MATH 0
#define CUBLAS_OP_T 1
#define CUBLAS_OP_N 0
#define CUBLAS_COMPUTE_16F 0
#define CUBLAS_COMPUTE_32F 0
#define CUBLAS_COMPUTE_32F_FAST_16F 0
#define CUBLAS_GEMM_DEFAULT_TENSOR_OP 0
#define CUBLAS_GEMM_DEFAULT 0
static inline cublasStatus_t cublasCreate(cublasHandle_t *) { return 0; }
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return 0; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t, void *) { return 0; }
static inline cublasStatus_t cublasDestroy(cublasHandle_t) { return 0; }
static inline const char * cublasGetStatusString(cublasStatus_t) { return ""; }
"""

KERNEL_RE = re.compile(r"_Z18flash_attn_ext_vecILi(\d+)ELi(\d+)EL9ggml_type(\d+)ELS0_(\d+)ELb([01])E(?:Li(\d+)E)?")
# flash_attn_ext_f16<DKQ, DV, ncols1, ncols2, use_logit_softcap, V_is_K_view, use_sparse, kv_dec>; kv_dec a bool, or
# the K/V type pair the kernel decodes as an int (0: none)
MMA_KERNEL_RE = re.compile(
    r"_Z18flash_attn_ext_f16ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb([01])ELb([01])EL[bi](\d+)E")


@dataclasses.dataclass
class ResourceUsage:
    """What ptxas -v reports for one kernel."""
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclasses.dataclass
class SassCounts:
    """Instruction counts of one kernel's SASS, in all and in its main loop."""
    instructions: int = 0
    loop_instructions: int = 0
    loop_ldl: int = 0
    loop_stl: int = 0
    loop_ldg_before_sts: int = 0
    loop_ldg_after_sts: int = 0
    loop_rolled: tuple[int, ...] = ()  # sizes of the loops nested in the main loop (see nested_loops)


def parse_ptxas(text: str) -> dict[str, ResourceUsage]:
    """ptxas -v output: per entry function, registers, stack frame and spills."""
    out: dict[str, ResourceUsage] = {}
    name = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or re.search(r"Function properties for (\w+)", line)
        if m:
            name = m.group(1)
            out.setdefault(name, ResourceUsage())
            continue
        if name is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[name].stack, out[name].spill_stores, out[name].spill_loads = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[name].registers = int(m.group(1))
    return out


_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def split_sass(text: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass output: per function, (address, instruction) in order."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = _SASS_LINE.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def _opcode(instr: str) -> str:
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def backward_branches(instrs: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(target, branch address) of every branch that jumps back, in the order of the branches."""
    loops = []
    for addr, ins in instrs:
        if _opcode(ins).startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", ins)
            if m and int(m.group(1), 16) < addr:
                loops.append((int(m.group(1), 16), addr))
    return loops


def nested_loops(loops: list[tuple[int, int]], lo: int, hi: int, instrs: list[tuple[int, str]]) -> tuple[int, ...]:
    """Sizes of the loops inside [lo, hi] (none of them inside another): loops the compiler kept rolled, whose
    body the enclosing loop's count holds once whatever their trip count."""
    inside = [(a, b) for a, b in loops if lo <= a and b <= hi and (a, b) != (lo, hi)]
    outer = [(a, b) for a, b in inside if not any((c, d) != (a, b) and c <= a and b <= d for c, d in inside)]
    return tuple(sum(a <= addr <= b for addr, _ in instrs) for a, b in sorted(set(outer)))


def sass_stats(instrs: list[tuple[int, str]]) -> SassCounts:
    """Counts over a function and over its main loop: the longest backward branch before the first
    unconditional EXIT (later code holds the out-of-line paths of divergent shuffles, whose branches jump back)."""
    stats = SassCounts(instructions=len(instrs))
    exit_at = next((i for i, (_, ins) in enumerate(instrs) if _opcode(ins) == "EXIT" and not ins.startswith("@")),
                   len(instrs))
    loops = backward_branches(instrs[:exit_at])
    if not loops:
        return stats
    lo, hi = max(loops, key=lambda loop: loop[1] - loop[0])
    stats.loop_rolled = nested_loops(loops, lo, hi, instrs)
    seen_sts = False
    for addr, ins in instrs:
        if not lo <= addr <= hi:
            continue
        op = _opcode(ins)
        stats.loop_instructions += 1
        stats.loop_ldl += op.startswith("LDL")
        stats.loop_stl += op.startswith("STL")
        seen_sts = seen_sts or op.startswith("STS")
        if op.startswith("LDG"):
            if seen_sts:
                stats.loop_ldg_after_sts += 1
            else:
                stats.loop_ldg_before_sts += 1
    return stats


@dataclasses.dataclass
class TileLoops:
    """The innermost loops of a tensor-core FA kernel that hold MMA instructions: one per peeled variant of its
    KV-tile iteration. Counts of the largest."""
    count: int = 0
    smallest: int = 0
    largest: int = 0
    hmma: int = 0
    ldg: int = 0
    ldgsts: int = 0
    sts: int = 0
    rolled: tuple[int, ...] = ()  # sizes of the loops nested in the largest (see nested_loops)


def mma_tile_loops(instrs: list[tuple[int, str]]) -> TileLoops:
    """Loops with HMMA that contain no other such loop."""
    def ops(lo: int, hi: int) -> list[str]:
        return [_opcode(ins) for addr, ins in instrs if lo <= addr <= hi]

    loops = backward_branches(instrs)
    with_mma = [(lo, hi) for lo, hi in loops if any(op.startswith("HMMA") for op in ops(lo, hi))]
    inner = [(lo, hi) for lo, hi in with_mma
             if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in with_mma)]
    if not inner:
        return TileLoops()
    bodies = [ops(lo, hi) for lo, hi in inner]
    big_at = max(range(len(inner)), key=lambda k: len(bodies[k]))
    big = bodies[big_at]
    count = lambda prefix: sum(op.split(".")[0] == prefix for op in big)
    return TileLoops(count=len(bodies), smallest=min(map(len, bodies)), largest=len(big), hmma=count("HMMA"),
                     ldg=count("LDG"), ldgsts=count("LDGSTS"), sts=count("STS"),
                     rolled=nested_loops(loops, *inner[big_at], instrs))


def ggml_type_names(tree: Path) -> dict[int, str]:
    text = (tree / "ggml" / "include" / "ggml.h").read_text()
    return {int(v): n.lower() for n, v in re.findall(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", text)}


def find_cuobjdump(explicit: str | None) -> str:
    if explicit:
        return explicit
    found = proc.which("cuobjdump")
    if found:
        return found
    tools = cache_dir() / "tools"
    wanted = ("cuobjdump", "nvdisasm")
    if not all(sorted(tools.glob(f"**/bin/{tool}")) for tool in wanted):
        tools.mkdir(parents=True, exist_ok=True)
        done = proc.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                         "--platform", "manylinux2014_x86_64", "--python-version", "3.12",
                         *(f"nvidia-cuda-{tool}" for tool in wanted), "-d", tools])
        if done.returncode != 0:
            raise SystemExit(f"fattn_vec_stats: pip download failed: {done.stderr.strip()[-2000:]}")
        for wheel in tools.glob("nvidia_cuda_*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tools / "x")
    hits = {tool: sorted(tools.glob(f"**/bin/{tool}")) for tool in wanted}
    if not all(hits.values()):
        raise SystemExit("fattn_vec_stats: no cuobjdump on PATH and none in the PyPI wheels")
    for paths in hits.values():
        paths[-1].chmod(0o755)
    return str(hits["cuobjdump"][-1])


def is_mma_instance(instance: str) -> bool:
    """A tensor-core kernel's instance file, named by its stem; vector-kernel instances go by their type pair."""
    return instance.startswith("fattn-mma-f16")


def compile_instance(tree: Path, instance: str, arch: str, defines: list[str], work: Path) -> tuple[Path, str]:
    cuda_dir = tree / "ggml" / "src" / "ggml-cuda"
    stem = instance if is_mma_instance(instance) else f"fattn-vec-instance-{instance}"
    source = cuda_dir / "template-instances" / f"{stem}.cu"
    if not source.is_file():
        raise SystemExit(f"fattn_vec_stats: no {source.relative_to(tree)}")
    (work / "cublas_v2.h").write_text(CUBLAS_STUB)
    obj = work / f"{instance}.o"
    cmd = ["nvcc", "-std=c++17", "-O3", f"-arch=sm_{arch}", "--extended-lambda", f"-I{work}",
           f"-I{tree / 'ggml' / 'include'}", f"-I{tree / 'ggml' / 'src'}", f"-I{cuda_dir}", "-DGGML_USE_CUDA",
           *(f"-D{d}" for d in defines),
           "-Xptxas", "-v", "-c", str(source), "-o", str(obj)]
    done = proc.run(cmd)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"fattn_vec_stats: nvcc failed ({done.returncode})")
    return obj, done.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("instance", help="fattn-vec-instance-NAME.cu: turbo3-turbo3, q8_0-turbo3, f16-f16, ...; or the "
                                     "stem of a tensor-core instance file: fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2")
    ap.add_argument("--tree", default=str(ROOT / "vendor" / "llama.cpp"))
    ap.add_argument("--arch", default="90")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="extra macro for nvcc")
    ap.add_argument("--filter", default="", help="regex over the printed kernel label, e.g. 'D=256 ncols=2'")
    ap.add_argument("--softcap", action="store_true", help="also the logit-softcap variants")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--keep", help="keep the object file in this folder")
    args = ap.parse_args(argv)

    tree = Path(args.tree)
    names = ggml_type_names(tree)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        obj, ptxas_text = compile_instance(tree, args.instance, args.arch, args.defines, work)
        cuobjdump = find_cuobjdump(args.cuobjdump)
        # cuobjdump runs nvdisasm, found next to it (the PyPI wheels) or on PATH
        path = os.pathsep.join([str(Path(cuobjdump).parent), os.environ.get("PATH", "")])
        done = proc.run([cuobjdump, "-sass", obj], env={"PATH": path})
        if done.returncode != 0:
            raise SystemExit(f"fattn_vec_stats: cuobjdump failed: {done.stderr.strip()}")
        sass_text = done.stdout
    ptxas = parse_ptxas(ptxas_text)
    sass = split_sass(sass_text)
    if is_mma_instance(args.instance):
        return print_mma(ptxas, sass, args.filter)

    rows = []
    for name, instrs in sass.items():
        m = KERNEL_RE.match(name)
        if not m:
            continue
        d, ncols, tk, tv, softcap, ncols2 = (int(g or 1) for g in m.groups())
        if softcap and not args.softcap:
            continue
        heads = f" heads={ncols2}" if ncols2 > 1 else ""  # Q heads of a GQA group per block
        label = f"D={d} ncols={ncols}{heads} K={names.get(tk, tk)} V={names.get(tv, tv)}" + (" softcap" if softcap else "")
        if not re.search(args.filter, label):
            continue
        rows.append((d, ncols, softcap, label, ptxas.get(name, ResourceUsage()), sass_stats(instrs)))
    print(f"{'kernel':<48} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'instrs':>6} {'loop':>5} "
          f"{'LDL/STL':>7} {'LDG pre/post KQ':>15} {'rolled':>8}")
    for *_, label, p, s in sorted(rows, key=lambda r: r[:3]):
        print(f"{label:<48} {p.registers:>4} {p.stack:>5} {f'{p.spill_stores}/{p.spill_loads}':>11} "
              f"{s.instructions:>6} {s.loop_instructions:>5} {f'{s.loop_ldl}/{s.loop_stl}':>7} "
              f"{f'{s.loop_ldg_before_sts}/{s.loop_ldg_after_sts}':>15} {rolled_cell(s.loop_rolled):>8}")
    return 0 if rows else 1


def rolled_cell(sizes: tuple[int, ...]) -> str:
    """The rolled loops' sizes, "-" for none: where there are any, the loop's count is not what a trip executes."""
    return "+".join(map(str, sizes)) or "-"


def print_mma(ptxas: dict[str, ResourceUsage], sass: dict[str, list[tuple[int, str]]], pattern: str) -> int:
    rows = []
    for name, instrs in sass.items():
        m = MMA_KERNEL_RE.match(name)
        if not m:
            continue
        dkq, dv, ncols1, ncols2, softcap, v_is_k, sparse, kv_dec = map(int, m.groups())
        label = (f"D={dkq} ncols1={ncols1} ncols2={ncols2}" + (" kv_dec" if kv_dec else "") +
                 (" softcap" if softcap else "") + (" V=K" if v_is_k else "") + (" sparse" if sparse else ""))
        if re.search(pattern, label):
            rows.append((dkq, ncols1, ncols2, label, ptxas.get(name, ResourceUsage()), len(instrs),
                         mma_tile_loops(instrs)))
    print(f"{'kernel':<44} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'instrs':>6} {'tile loops':>10} "
          f"{'sizes':>11} {'HMMA':>4} {'LDG':>4} {'LDGSTS':>6} {'STS':>4} {'rolled':>8}")
    for *_, label, p, n, t in sorted(rows, key=lambda r: r[:4]):
        print(f"{label:<44} {p.registers:>4} {p.stack:>5} {f'{p.spill_stores}/{p.spill_loads}':>11} {n:>6} "
              f"{t.count:>10} {f'{t.smallest}-{t.largest}':>11} {t.hmma:>4} {t.ldg:>4} {t.ldgsts:>6} {t.sts:>4} "
              f"{rolled_cell(t.rolled):>8}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
