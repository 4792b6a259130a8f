#!/usr/bin/env python3
"""Engine speed on the real pinned tree with the three-patch test chain (tests/data/real-chain).

Measures, through the CLI as a user runs it (Python start-up included), the median of
--repeat runs of: vendor fetch into an empty project with the cache warm, apply and unapply
of the three patches, and verify-patches warm. Prints a markdown table, or JSON with --json.

    python scripts/bench_engine.py [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"vendor fetch (cache hit)": 5.0, "apply (3 patches)": 3.0, "unapply (3 patches)": 3.0,
         "verify-patches (3 patches, warm)": 10.0}


def polyforge(*args: str, cwd: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "polyforge", *args], cwd=cwd, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"polyforge {' '.join(args)} failed: {done.stderr.strip()}")
    return elapsed


def project(base: Path, name: str) -> Path:
    root = base / name
    (root / "vendor").mkdir(parents=True)
    shutil.copy(ROOT / "vendor" / "pin.yaml", root / "vendor" / "pin.yaml")
    shutil.copytree(ROOT / "tests" / "data" / "real-chain", root / "patches")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {k: [] for k in GOALS}
    with tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp:
        base = Path(tmp)
        polyforge("vendor", "fetch", cwd=project(base, "warmup"))  # fills the cache if cold
        for i in range(args.repeat):
            root = project(base, f"p{i}")
            samples["vendor fetch (cache hit)"].append(polyforge("vendor", "fetch", cwd=root))
            samples["apply (3 patches)"].append(polyforge("apply", cwd=root))
            samples["verify-patches (3 patches, warm)"].append(polyforge("verify-patches", cwd=root))
            samples["unapply (3 patches)"].append(polyforge("unapply", cwd=root))
            shutil.rmtree(root)
    rows = {k: {"median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3), "goal_s": GOALS[k],
                "ok": statistics.median(v) <= GOALS[k]} for k, v in samples.items()}
    info = {"repeat": args.repeat, "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "results": rows}
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"| step | median s | max s | goal s | ok |\n|---|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['median_s']} | {r['max_s']} | {r['goal_s']} | {'yes' if r['ok'] else 'NO'} |")
    print(f"\n{args.repeat} runs, {os.cpu_count()} CPUs, load average {info['load_avg'][0]:.1f}")


if __name__ == "__main__":
    main()
