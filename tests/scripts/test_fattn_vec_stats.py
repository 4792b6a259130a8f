"""scripts/fattn_vec_stats.py's parsers on synthetic ptxas and cuobjdump output (no nvcc needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fattn_vec_stats.py"
spec = importlib.util.spec_from_file_location("fattn_vec_stats", SCRIPT)
stats = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = stats  # dataclasses look their module up there
spec.loader.exec_module(stats)

NAME = "_Z18flash_attn_ext_vecILi128ELi4EL9ggml_type44ELS0_44ELb0EEvPKc"

PTXAS = f"""ptxas info    : Compiling entry function '{NAME}' for 'sm_90'
ptxas info    : Function properties for {NAME}
    48 bytes stack frame, 96 bytes spill stores, 92 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 48 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z5otheri' for 'sm_90'
ptxas info    : Function properties for _Z5otheri
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers
"""


def _sass(lines: list[str]) -> str:
    body = "".join(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x0000 */\n"
                   for i, ins in enumerate(lines))
    return f"\t\tFunction : {NAME}\n{body}"


def test_parse_ptxas_per_function():
    p = stats.parse_ptxas(PTXAS)
    assert (p[NAME].registers, p[NAME].stack, p[NAME].spill_stores, p[NAME].spill_loads) == (168, 48, 96, 92)
    assert p["_Z5otheri"].registers == 20 and p["_Z5otheri"].stack == 0


def test_loop_is_the_longest_backward_branch_before_exit():
    lines = ["PREEXIT",                  # 0x00: not an exit
             "MOV R1, c[0x0][0x28]",     # 0x10
             "LDG.E R2, desc[UR4][R4.64]",  # 0x20: loop start (K load, before the KQ store)
             "LDL R3, [R1]",             # 0x30
             "STS [R5], R2",             # 0x40: KQ to shared
             "LDG.E R6, desc[UR4][R8.64]",  # 0x50: V load after the KQ store
             "STL [R1], R3",             # 0x60
             "@!P0 BRA 0x20",            # 0x70: loop end
             "@P1 BRA 0x50",             # 0x80: shorter backward branch
             "EXIT",                     # 0x90
             "SHFL.BFLY R0, R0, 0x1, 0x1f",  # 0xa0: divergent-shuffle path after the exit ...
             "BRA 0x10"]                 # 0xb0: ... jumping far back: not the loop
    instrs = stats.split_sass(_sass(lines))[NAME]
    s = stats.sass_stats(instrs)
    assert s.instructions == 12
    assert s.loop_instructions == 6  # 0x20..0x70
    assert (s.loop_ldl, s.loop_stl) == (1, 1)
    assert (s.loop_ldg_before_sts, s.loop_ldg_after_sts) == (1, 1)


def test_no_loop_no_loop_counts():
    s = stats.sass_stats(stats.split_sass(_sass(["MOV R1, R2", "EXIT"]))[NAME])
    assert (s.instructions, s.loop_instructions) == (2, 0)


def test_kernel_name_template_arguments():
    assert stats.KERNEL_RE.match(NAME).groups() == ("128", "4", "44", "44", "0", None)
    # with the Q heads per block (ncols2) as the last template argument
    name = "_Z18flash_attn_ext_vecILi64ELi4EL9ggml_type8ELS0_44ELb1ELi2EEvPKc"
    assert stats.KERNEL_RE.match(name).groups() == ("64", "4", "8", "44", "1", "2")
