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


MMA_NAME = "_Z18flash_attn_ext_f16ILi128ELi128ELi16ELi2ELb0ELb0ELb0ELb1EEvPKcS1_"


def test_mma_kernel_name_template_arguments():
    assert stats.MMA_KERNEL_RE.match(MMA_NAME).groups() == ("128", "128", "16", "2", "0", "0", "0", "1")
    assert not stats.KERNEL_RE.match(MMA_NAME) and not stats.MMA_KERNEL_RE.match(NAME)
    # kv_dec as the int of the K/V type pair the kernel decodes (one kernel per pair), 0 for none
    pair = MMA_NAME.replace("ELb1E", "ELi1436E", 1)
    assert pair != MMA_NAME and stats.MMA_KERNEL_RE.match(pair).groups()[-1] == "1436"


def test_mma_tile_loops_are_the_innermost_loops_with_mma():
    lines = ["MOV R1, c[0x0][0x28]",          # 0x00
             "LDG.E R2, desc[UR4][R4.64]",    # 0x10: outer loop start
             "STS.128 [R5], R8",              # 0x20: first variant of the tile iteration
             "HMMA.16816.F32 R8, R4, R20, R8",  # 0x30
             "@P0 BRA 0x20",                  # 0x40: its loop (3 instructions)
             "LDGSTS.E.BYPASS.128 [R6], desc[UR4][R4.64]",  # 0x50: second variant
             "LDG.E R3, desc[UR4][R4.64]",    # 0x60
             "HMMA.16816.F32 R8, R4, R20, R8",  # 0x70
             "HMMA.16816.F32 R8, R4, R20, R8",  # 0x80
             "@P1 BRA 0x50",                  # 0x90: its loop (5 instructions)
             "IADD3 R1, R1, 0x1, RZ",         # 0xa0: a loop without MMA
             "@P2 BRA 0xa0",                  # 0xb0
             "@P3 BRA 0x10",                  # 0xc0: the outer loop, holding both: not a tile loop
             "EXIT"]                          # 0xd0
    instrs = stats.split_sass(_sass(lines).replace(NAME, MMA_NAME))[MMA_NAME]
    t = stats.mma_tile_loops(instrs)
    assert (t.count, t.smallest, t.largest) == (2, 3, 5)
    assert (t.hmma, t.ldg, t.ldgsts, t.sts) == (2, 1, 1, 0)


def test_mma_without_loops():
    instrs = stats.split_sass(_sass(["HMMA.16816.F32 R8, R4, R20, R8", "EXIT"]).replace(NAME, MMA_NAME))[MMA_NAME]
    assert stats.mma_tile_loops(instrs) == stats.TileLoops()


def test_rolled_loops_inside_the_main_loop_are_reported():
    # a vector kernel's K/V loop holding a rolled V loop, and a tile loop holding two rolled decode loops
    vec = ["MOV R1, R2",                     # 0x00
           "LDG.E R2, desc[UR4][R4.64]",     # 0x10: main loop start
           "FFMA R3, R2, R2, R3",            # 0x20: inner loop start
           "@P0 BRA 0x20",                   # 0x30: inner loop (2 instructions)
           "STS [R5], R2",                   # 0x40
           "@P1 BRA 0x10",                   # 0x50: main loop end
           "EXIT"]                           # 0x60
    s = stats.sass_stats(stats.split_sass(_sass(vec))[NAME])
    assert s.loop_instructions == 5 and s.loop_rolled == (2,)
    mma = ["LDGSTS.E.BYPASS.128 [R6], desc[UR4][R4.64]",  # 0x00: tile loop start
           "PRMT R7, R2, 0x3210, R3",        # 0x10: decode loop of K
           "STS.128 [R5], R8",               # 0x20
           "@P0 BRA 0x10",                   # 0x30: (3 instructions)
           "HMMA.16816.F32 R8, R4, R20, R8",  # 0x40
           "PRMT R7, R2, 0x3210, R3",        # 0x50: decode loop of V
           "LOP3.LUT R7, R7, 0x7, RZ, 0xc0, !PT",  # 0x60
           "STS.128 [R5], R8",               # 0x70
           "@P1 BRA 0x50",                   # 0x80: (4 instructions)
           "HMMA.16816.F32 R8, R4, R20, R8",  # 0x90
           "@P2 BRA 0x0",                    # 0xa0: tile loop end
           "EXIT"]                           # 0xb0
    t = stats.mma_tile_loops(stats.split_sass(_sass(mma).replace(NAME, MMA_NAME))[MMA_NAME])
    assert (t.count, t.largest, t.hmma, t.rolled) == (1, 11, 2, (3, 4))
    assert stats.rolled_cell(t.rolled) == "3+4" and stats.rolled_cell(()) == "-"
    # loops without rolled loops inside report none
    assert stats.sass_stats(stats.split_sass(_sass(["LDG.E R2, desc[UR4][R4.64]", "@P0 BRA 0x0", "EXIT"]))[NAME]).loop_rolled == ()
