"""backend-ops: test-backend-ops [MODE] -o OP [-p PATTERN] -b BACKEND; pass/fail/skip counts.

params: op (required), pattern, backend (default CPU), mode (test|grad, default test).
metrics: passed, failed, skipped (not supported or skipped for speed), total, exit_code.
"""

from __future__ import annotations

import re

from .. import schema
from ..errors import VerificationFailed
from ._common import run_logged, strip_ansi

_CASE = re.compile(r"^\s+([A-Z0-9_]+)\((.*)\):\s*(.*)$")
_SUMMARY = re.compile(r"^\s*(\d+)/(\d+) tests passed")


def validate_params(params: dict, where: str, models: tuple[str, ...]) -> dict:
    schema.only(params, {"op", "pattern", "backend", "mode"}, where, section="params")
    return {"op": schema.need(params, "op", str, where, section="params"),
            "pattern": schema.optional(params, "pattern", str, where, section="params"),
            "backend": schema.optional(params, "backend", str, where, "CPU", section="params"),
            "mode": schema.choice(params, "mode", ("test", "grad"), where, "test", section="params")}


def parse(text: str) -> dict:
    passed = failed = skipped = 0
    summary_total = None
    for line in strip_ansi(text).splitlines():
        m = _CASE.match(line)
        if m:
            status = m.group(3)
            if status.endswith("OK"):
                passed += 1
            elif "FAIL" in status:
                failed += 1
            elif "not supported" in status or "skipping" in status:
                skipped += 1
            continue
        s = _SUMMARY.match(line)
        if s:
            summary_total = (summary_total or 0) + int(s.group(2))
    return {"passed": passed, "failed": failed, "skipped": skipped, "total": passed + failed + skipped,
            "reported_total": summary_total}


def run(ctx) -> dict:
    p = ctx.gate.params
    argv = [ctx.bin("test-backend-ops"), p["mode"], "-o", p["op"], "-b", p["backend"]]
    if p["pattern"]:
        argv += ["-p", p["pattern"]]
    log = ctx.work_dir / "test-backend-ops.log"
    ctx.log(f"running {' '.join(map(str, argv[1:]))}")
    done = run_logged(argv, log, ctx.gate.timeout, env=ctx.env)
    metrics = parse(done.stdout)
    metrics["exit_code"] = done.returncode
    if done.returncode != 0:
        ctx.note_failed_command(done)
    if metrics["total"] == 0 and done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        raise VerificationFailed(f"test-backend-ops failed with exit {done.returncode}: {last} (log: {log})")
    return metrics
