"""command: run a test binary or a script and read its result.

params: argv (list; placeholders {bin:NAME} {model:NAME} {data:PATH} {root} {gates}
{build} {work}; a leading "python" means this interpreter), parse: json | counts | exit.
  json:   the last stdout line that is a JSON object; its "metrics" mapping (or the whole
          object) becomes the metrics, and its "ok" becomes the metric ok
  counts: "N passed, M failed" (last occurrence) gives passed and failed
  exit:   nothing but the exit status
metrics: what parse read, and always exit_code.
"""

from __future__ import annotations

import json
import re
import sys

from .. import schema
from ..errors import BadInput
from ._common import run_logged

_COUNTS = re.compile(r"(\d+)\s+passed,\s*(\d+)\s+failed")


def validate_params(params: dict, where: str, models: tuple[str, ...]) -> dict:
    schema.only(params, {"argv", "parse"}, where, section="params")
    argv = schema.str_list(params, "argv", where, section="params", required=True, numbers_as_text=True)
    parse = schema.choice(params, "parse", ("json", "counts", "exit"), where, "exit", section="params")
    for model in re.findall(r"\{model:([^{}]+)\}", " ".join(argv)):
        if model not in models:
            raise BadInput(f"{where}: {{model:{model}}} must be listed under 'models'")
    return {"argv": argv, "parse": parse}


def parse_output(stdout: str, mode: str) -> dict:
    if mode == "json":
        for line in reversed(stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                metrics = dict(obj["metrics"]) if isinstance(obj.get("metrics"), dict) else dict(obj)
                if "ok" in obj:
                    metrics["ok"] = bool(obj["ok"])
                return metrics
        return {}
    if mode == "counts":
        found = _COUNTS.findall(stdout)
        if found:
            passed, failed = found[-1]
            return {"passed": int(passed), "failed": int(failed)}
        return {}
    return {}


def run(ctx) -> dict:
    p = ctx.gate.params
    argv = [ctx.substitute(a) for a in p["argv"]]
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    ctx.log(f"running {' '.join(argv)}")
    done = run_logged(argv, ctx.work_dir / "command.log", ctx.gate.timeout, cwd=ctx.project_root, env=ctx.env)
    if done.returncode != 0:
        ctx.note_failed_command(done)
    metrics = parse_output(done.stdout, p["parse"])
    metrics["exit_code"] = done.returncode
    return metrics
