#!/usr/bin/env python3
"""The shared compiler cache's figures: four full builds of one build key, side by side in one run.

Each build runs in its own fresh clone of this repository (HEAD: `git clone` of it, then `polyforge
vendor fetch` and `apply`) with its own empty local ccache directory, one after the other:

  cold          no remote cache: the plain cold build every other figure is a ratio of
  cold+remote   a real redis-server (started here, on a free localhost port, empty) as the remote:
                the first runner of a fleet, which fills it
  second clone  another clone at another path, empty local cache, the same remote, now full
  remote down   the remote URL names a closed port: the warning, then a local build

Each row: wall seconds (polyforge's own, configure included) and CPU seconds (the build and all it
ran: on a machine shared with other work, the steadier measure), each as a ratio to the cold build, the
compilations and where they came from (ccache's stats log), and whether the binaries and
libraries are the same bytes as the cold+remote build's (sha256 from the manifests).

  scripts/remote_cache_bench.py [--jobs N] [--target T ...] [--cuda --arch 90] [--json] [--keep DIR]
                                [--repo DIR]

--repo clones another checkout (default: this one). The builds run the polyforge this Python
imports: to edit polyforge while it runs, run a copy of the code, e.g.
  git archive HEAD polyforge scripts | tar -x -C /tmp/frozen
  PYTHONPATH=/tmp/frozen python /tmp/frozen/scripts/remote_cache_bench.py --repo .

Needs redis-server on PATH (Debian: apt-get install redis-server). Exit 0 with the table, 2 on bad
input, 1 when a build fails.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("error: redis-server not found (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("error: redis-server did not start")


def polyforge(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polyforge", *args], cwd=cwd, env=env, text=True,
                          capture_output=True)


def clone(repo: Path, dest: Path, env: dict[str, str]) -> None:
    subprocess.run(["git", "clone", "-q", str(repo), str(dest)], check=True)
    for step in (["vendor", "fetch"], ["apply"]):
        done = polyforge(step, dest, env)
        if done.returncode != 0:
            sys.exit(f"error: polyforge {' '.join(step)} in {dest} failed: {done.stderr.strip()[-400:]}")


def run_build(name: str, repo: Path, dest: Path, build_args: list[str], remote: str | None,
              base_env: dict[str, str]) -> dict:
    env = {**base_env, "CCACHE_DIR": str(dest.parent / f"ccache-{dest.name}")}
    env.pop("POLYFORGE_REMOTE_CACHE", None)
    if remote is not None:
        env["POLYFORGE_REMOTE_CACHE"] = remote
    clone(repo, dest, env)
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = polyforge(["build", "--json", *build_args], dest, env)
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the build and everything it ran (compilers, linker): what a busy machine's
    # other work changes far less than the wall time
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        sys.exit(f"error: the {name} build failed: {done.stderr.strip()[-800:]}")
    result = json.loads(done.stdout)
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    return {"name": name, "seconds": result["seconds"], "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
            "key": result["key"],
            "compiler_cache": result["compiler_cache"], "warnings": warnings,
            "artifacts": {a["name"]: a["sha256"] for a in result["artifacts"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--arch")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to clone (default: this one)")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: already exists")
    build_args = ["-j", str(args.jobs)] + [a for t in args.target for a in ("--target", t)]
    if args.cuda:
        build_args.append("--cuda")
    if args.arch:
        build_args += ["--arch", args.arch]
    work = args.keep or Path(tempfile.mkdtemp(prefix="polyforge-remote-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CCACHE_")}
    repo = args.repo.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("error: terminated"))  # the finally below stops redis
    redis, port = start_redis(work)
    try:
        closed = free_port()  # nothing listens there
        remote, down = f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{closed}"
        rows = [run_build("cold", repo, work / "cold", build_args, None, base_env),
                run_build("cold+remote", repo, work / "first", build_args, remote, base_env),
                run_build("second clone", repo, work / "second", build_args, remote, base_env),
                run_build("remote down", repo, work / "down", build_args, down, base_env)]
    finally:
        redis.terminate()
        redis.wait(timeout=30)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    cold, cold_cpu = rows[0]["seconds"], rows[0]["cpu_seconds"]
    reference = rows[1]["artifacts"]
    for row in rows:
        row["ratio_to_cold"] = round(row["seconds"] / cold, 3)
        row["cpu_ratio_to_cold"] = round(row["cpu_seconds"] / cold_cpu, 3) if cold_cpu else None
        row["same_binaries"] = row["artifacts"] == reference
        row["artifact_count"] = len(row["artifacts"])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"build key {rows[0]['key']}, -j{args.jobs}, {len(reference)} binaries and libraries")
    print("| build | seconds | ratio to cold | CPU seconds | CPU ratio to cold | compilations | from remote | from local "
          "| compiled | same sha256 as cold+remote | warnings |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        c = row["compiler_cache"] or {}
        print(f"| {row['name']} | {row['seconds']:.1f} | {row['ratio_to_cold']:.3f} | {row['cpu_seconds']:.1f} | "
              f"{row['cpu_ratio_to_cold']} | {c.get('compilations')} | "
              f"{c.get('remote_hits')} | {c.get('local_hits')} | {c.get('compiled')} | "
              f"{'yes' if row['same_binaries'] else 'no'} | {len(row['warnings'])} |")
    for row in rows:
        for w in row["warnings"]:
            print(f"{row['name']}: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
