"""Gate key-guard: the key guard of quantized K caches, through key_guard.cpp, built here against the
gate's llama build.

For each K type: kl and kl_q8_0 are the guard's estimates (the K type's and q8_0's attention KL
divergence on the first ubatch, summed over layers), warned whether llama_key_guard_warning() gave one,
max_dlogit the largest logit difference against the same decode with the guard off (must be 0).
Prints one JSON object: {"ok": ..., "metrics": {type: {...}}}.
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
    cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", str(HERE / "key_guard.cpp"),
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
    ap.add_argument("--types", required=True, help="K types, comma-separated; TYPE:noscale without the key scale")
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    exe = args.work / "key_guard"
    build(args.root, args.lib_from.resolve().parent, exe)

    done = subprocess.run([str(exe), args.model, args.text, args.types, str(args.tokens), "4"],
                          capture_output=True, text=True)
    (args.work / "key_guard.log").write_text(done.stdout + done.stderr)
    try:
        metrics = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    except (IndexError, ValueError):
        metrics = {}
    ok = done.returncode == 0 and bool(metrics)
    if not ok:
        print(f"{exe.name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    for name, row in metrics.items():
        print(f"{name}: kl {row['kl']:g} (q8_0 {row['kl_q8_0']:g}), warned {row['warned']}, "
              f"max_dlogit {row['max_dlogit']:g}", file=sys.stderr)
    print(json.dumps({"ok": ok, "metrics": metrics}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
