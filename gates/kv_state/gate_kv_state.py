"""Gate kv-state-turbo: a K-shift and a state save/restore of quantized KV caches (0083's key scale and
mean ride along with the keys), through kv_shift_state.cpp, built here against the gate's llama build.

For each K/V pair: shift_kld is the divergence of the shifted cache from a shifted f16 cache, base_kld
the same without the shift (see the program's header); state_* compare probes scored before a save
and after a restore into a new context; cleared_max_dlogit and emptied_* compare a context reused
after a clear with and without its data against a new one.
Prints one JSON object: {"ok": ..., "metrics": {pair: {...}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(root: Path, lib_dir: Path, out: Path) -> None:
    inc = root / "vendor" / "llama.cpp"
    cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", str(HERE / "kv_shift_state.cpp"),
           f"-I{inc / 'include'}", f"-I{inc / 'ggml' / 'include'}", f"-L{lib_dir}",
           "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib_dir}", "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"error: building {out.name} failed with exit {done.returncode}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="the project root (vendor/llama.cpp's headers)")
    ap.add_argument("--lib-from", type=Path, required=True, help="a binary of the build; libllama sits beside it")
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--pairs", default="turbo3/turbo3,turbo4/turbo4,q8_0/turbo3")
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--shift", type=int, default=512)
    ap.add_argument("--probes", type=int, default=64)
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    exe = args.work / "kv_shift_state"
    build(args.root, args.lib_from.resolve().parent, exe)

    metrics: dict = {}
    ok = True
    for pair in args.pairs.split(","):
        k, v = pair.split("/")
        done = subprocess.run([str(exe), args.model, args.text, k, v, str(args.tokens), str(args.shift),
                               str(args.probes)], capture_output=True, text=True)
        (args.work / f"{k}-{v}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            ok = False
            print(f"{pair}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        try:
            row = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            ok = False
            print(f"{pair}: no result line from {exe.name}", file=sys.stderr)
            continue
        metrics[pair] = {key: val for key, val in row.items() if key not in ("type_k", "type_v")}
        print(f"{pair}: " + ", ".join(f"{key} {row[key]:g}" for key in ("shift_kld", "base_kld", "state_max_dlogit",
                                                                           "cleared_max_dlogit", "emptied_max_dlogit")
                                       if isinstance(row.get(key), (int, float))), file=sys.stderr)
    print(json.dumps({"ok": ok, "metrics": metrics}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
