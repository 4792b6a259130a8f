"""Gates: gates/NAME.yaml declares a build, models, commands, metrics and thresholds;
running one yields a verdict {"gate", "ok", "metrics", "thresholds", ...}. A failed gate's
verdict also says why: "error" (one line) and, when a command failed, "output_tail" (the
last lines of its stderr, or of its stdout when stderr is empty).

Schema (validated into the dataclasses below):

    name: kld-gemma3            # equals the file's stem
    kind: perplexity-kld        # backend-ops | perplexity-kld | server | command
    description: one line
    build:                      # optional
      targets: [llama-perplexity]   # binaries it needs (built if missing)
      requires: any             # any | cpu | cuda: where the gate makes sense
    models: [gemma3-270m]       # fetched (and sha256-checked) before it runs
    timeout: 1800               # seconds, per command
    env: {GGML_CUDA_X: "1"}     # optional: environment of every command it runs
    params: {...}               # the kind's own, validated by its module
    thresholds:                 # every expression must hold for ok
      - "[q8_0/q8_0].kld_mean <= 0.05"
      - "[q8_0/turbo4].kld_mean <= 1.3 * [q8_0/q4_0].kld_mean"
      - "not dominates('q*/q*', '*/turbo*', 'kld_mean', 'bits_per_pair')"
      - "failed == 0 and passed >= 1"

Threshold expressions: numbers, + - * /, comparisons (chains too), and/or/not,
parentheses; `[CONFIG].metric` reads metrics[CONFIG][metric] (CONFIG may hold '/', '*'
is not allowed there), a bare name reads metrics[name]; functions min, max, abs, len,
and dominates(A, B, m1, m2, ...): true when some configuration matching glob A is no worse
than some configuration matching glob B in every metric m (lower is better) and better
in one. A metric the run did not produce fails its threshold, with the reason.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import proc
from ..errors import BadInput, PolyforgeError
from ._common import output_tail

KINDS = ("backend-ops", "perplexity-kld", "server", "command")
REQUIRES = ("any", "cpu", "cuda")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF = re.compile(r"\[([^\[\]*]+)\]\.([A-Za-z_][A-Za-z0-9_]*)")
_FUNCS = ("min", "max", "abs", "len", "dominates")


def _module(kind: str):
    return importlib.import_module(f"polyforge.gates.{kind.replace('-', '_')}")


@dataclass(frozen=True)
class GateBuild:
    targets: tuple[str, ...] = ()
    requires: str = "any"


@dataclass(frozen=True)
class Gate:
    name: str
    kind: str
    description: str
    build: GateBuild
    models: tuple[str, ...]
    params: dict
    thresholds: tuple[str, ...]
    timeout: float
    path: Path
    env: tuple[tuple[str, str], ...] = ()

    def applies_to(self, cuda: bool) -> bool:
        return self.build.requires == "any" or self.build.requires == ("cuda" if cuda else "cpu")


# -- loading -------------------------------------------------------------------------------
def gate_files(gates_dir: Path) -> list[Path]:
    if not gates_dir.is_dir():
        return []
    return sorted(p for p in gates_dir.glob("*.yaml") if p.name != "build.yaml")


def load_all(gates_dir: Path) -> list[Gate]:
    return [load(p) for p in gate_files(gates_dir)]


def find(gates_dir: Path, name: str) -> Gate:
    path = gates_dir / f"{name}.yaml"
    if not _NAME.match(name) or not path.is_file():
        known = ", ".join(p.stem for p in gate_files(gates_dir)) or "none"
        raise BadInput(f"unknown gate '{name}' (gates: {known})")
    return load(path)


def load(path: Path) -> Gate:
    where = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BadInput(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: a gate must be a mapping")
    allowed = {"name", "kind", "description", "build", "models", "params", "thresholds", "timeout", "env"}
    extra = set(raw) - allowed
    if extra:
        raise BadInput(f"{where}: unknown key(s) {', '.join(sorted(extra))} (allowed: {', '.join(sorted(allowed))})")
    name = raw.get("name")
    if name != path.stem:
        raise BadInput(f"{where}: 'name' must be the file's stem '{path.stem}' (got {name!r})")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise BadInput(f"{where}: 'kind' must be one of {', '.join(KINDS)} (got {kind!r})")
    build_raw = raw.get("build") or {}
    if not isinstance(build_raw, dict) or set(build_raw) - {"targets", "requires"}:
        raise BadInput(f"{where}: 'build' takes 'targets' and 'requires'")
    targets = build_raw.get("targets") or []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise BadInput(f"{where}: build.targets must be a list of target names")
    requires = build_raw.get("requires", "any")
    if requires not in REQUIRES:
        raise BadInput(f"{where}: build.requires must be one of {', '.join(REQUIRES)}")
    models = raw.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise BadInput(f"{where}: 'models' must be a list of model names")
    thresholds = raw.get("thresholds")
    if not isinstance(thresholds, list) or not thresholds or not all(isinstance(t, str) for t in thresholds):
        raise BadInput(f"{where}: 'thresholds' must be a non-empty list of expressions")
    for expr in thresholds:
        try:
            compile_expr(expr)
        except BadInput as exc:
            raise BadInput(f"{where}: threshold {expr!r}: {exc.message}") from None
    timeout = raw.get("timeout", 1800)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise BadInput(f"{where}: 'timeout' must be a positive number of seconds")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_NAME.match(k) for k in env) \
            or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in env.values()):
        raise BadInput(f"{where}: 'env' must map variable names to strings or numbers")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise BadInput(f"{where}: 'params' must be a mapping")
    params = _module(kind).validate(params, where, tuple(models))
    return Gate(name, kind, str(raw.get("description", "")), GateBuild(tuple(targets), requires), tuple(models),
                params, tuple(thresholds), float(timeout), path, tuple((k, str(v)) for k, v in env.items()))


# -- threshold expressions -----------------------------------------------------------------
_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
            ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
            ast.GtE, ast.Call, ast.Name, ast.Load, ast.Constant)


def _rewrite(expr: str) -> str:
    return _REF.sub(lambda m: f"__ref__({json.dumps(m.group(1).strip())}, {json.dumps(m.group(2))})", expr)


def compile_expr(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(_rewrite(expr), mode="eval")
    except SyntaxError as exc:
        raise BadInput(f"syntax error ({exc.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise BadInput(f"'{type(node).__name__}' is not allowed in a threshold")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in (*_FUNCS, "__ref__") or node.keywords:
                raise BadInput(f"only {', '.join(_FUNCS)} may be called")
        if isinstance(node, ast.Name) and node.id.startswith("__") and node.id != "__ref__":
            raise BadInput(f"name {node.id} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool)):
            raise BadInput("only numbers and strings may be constants")
    return tree


class MissingMetric(Exception):
    pass


def _dominates(metrics: dict, a_glob: str, b_glob: str, *names: str) -> bool:
    if not names:
        raise MissingMetric("dominates() needs at least one metric name")
    configs = {k: v for k, v in metrics.items() if isinstance(v, dict)}
    a_side = [k for k in configs if fnmatch.fnmatchcase(k, a_glob)]
    b_side = [k for k in configs if fnmatch.fnmatchcase(k, b_glob)]
    if not a_side or not b_side:
        raise MissingMetric(f"dominates: no configuration matches {a_glob if not a_side else b_glob!r}")
    for a in a_side:
        for b in b_side:
            if a == b:
                continue
            try:
                va = [float(configs[a][n]) for n in names]
                vb = [float(configs[b][n]) for n in names]
            except KeyError as exc:
                raise MissingMetric(f"no metric [{a if exc.args[0] not in configs[a] else b}].{exc.args[0]}") from None
            if all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb)):
                return True
    return False


def evaluate(expr: str, metrics: dict) -> dict:
    """{"ok": bool, "values": {ref: value}} or {"ok": False, "error": why}."""
    tree = compile_expr(expr)
    seen: dict[str, Any] = {}

    def ref(config: str, name: str):
        try:
            value = metrics[config][name]
        except (KeyError, TypeError):
            raise MissingMetric(f"no metric [{config}].{name}") from None
        seen[f"[{config}].{name}"] = value
        return value

    def node_value(node):  # a tiny interpreter over the whitelisted nodes
        if isinstance(node, ast.Expression):
            return node_value(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in ("true", "True"):
                return True
            if node.id in ("false", "False"):
                return False
            if node.id not in metrics or isinstance(metrics[node.id], dict):
                raise MissingMetric(f"no metric {node.id}")
            seen[node.id] = metrics[node.id]
            return metrics[node.id]
        if isinstance(node, ast.UnaryOp):
            v = node_value(node.operand)
            return not v if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(node_value(v) for v in node.values)
            return any(node_value(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            a, b = node_value(node.left), node_value(node.right)
            ops: dict[type, Callable] = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                                         ast.Div: lambda: a / b}
            return ops[type(node.op)]()
        if isinstance(node, ast.Compare):
            left = node_value(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = node_value(comp)
                ok = {ast.Eq: left == right, ast.NotEq: left != right, ast.Lt: left < right,
                      ast.LtE: left <= right, ast.Gt: left > right, ast.GtE: left >= right}[type(op)]
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            args = [node_value(a) for a in node.args]
            name = node.func.id
            if name == "__ref__":
                return ref(*args)
            if name == "dominates":
                return _dominates(metrics, *args)
            return {"min": min, "max": max, "abs": abs, "len": len}[name](*args)
        raise MissingMetric(f"cannot evaluate {type(node).__name__}")  # pragma: no cover - whitelisted

    try:
        result = node_value(tree)
    except MissingMetric as exc:
        return {"ok": False, "error": str(exc), "values": seen}
    except (TypeError, ZeroDivisionError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "values": seen}
    return {"ok": bool(result), "values": seen}


def judge(gate_name: str, metrics: dict, thresholds: tuple[str, ...] | list[str]) -> dict:
    results = {expr: evaluate(expr, metrics) for expr in thresholds}
    return {"gate": gate_name, "ok": all(r["ok"] for r in results.values()), "metrics": metrics,
            "thresholds": results}


# -- running -------------------------------------------------------------------------------
@dataclass
class GateContext:
    """What a gate kind needs: its binaries, models, a work folder, a timeout, a logger."""

    gate: Gate
    build_dir: Path
    work_dir: Path
    gates_dir: Path
    project_root: Path
    models: dict[str, Path]
    log: Callable[[str], None] = lambda message: None
    env: dict[str, str] = field(default_factory=dict)
    # the last command that failed, and the end of its output: the verdict's cause when the
    # gate fails (only then: a gate may expect a command to fail)
    failure: str | None = None
    failure_tail: list[str] = field(default_factory=list)

    def note_failure(self, what: str, output: str) -> None:
        self.failure, self.failure_tail = what, output_tail(output)

    def note_failed_command(self, done: proc.Completed) -> None:
        """A command that exited non-zero: its stderr's end (stdout's when stderr is empty)."""
        program = done.args[1] if done.args[0] == sys.executable and done.args[1:2] != ["-c"] else done.args[0]
        self.note_failure(f"{Path(program).name} exited with status {done.returncode}",
                          done.stderr if done.stderr.strip() else done.stdout)

    def bin(self, name: str) -> Path:
        path = self.build_dir / "bin" / name
        if not path.is_file():
            raise BadInput(f"gate {self.gate.name}: the build has no {name}",
                           hint=f"add {name} to the gate's build.targets")
        return path

    def model(self, name: str) -> Path:
        if name not in self.models:
            raise BadInput(f"gate {self.gate.name}: model '{name}' is not in its 'models' list")
        return self.models[name]

    def data(self, relative: str) -> Path:
        path = (self.gates_dir / relative).resolve()
        if not path.is_file():
            raise BadInput(f"gate {self.gate.name}: data file {relative} not found under {self.gates_dir}")
        return path

    def substitute(self, text: str) -> str:
        """{bin:NAME} {model:NAME} {data:PATH} {root} {gates} {build} {work} in an argument."""
        def one(m: re.Match) -> str:
            kind, _, arg = m.group(1).partition(":")
            if kind == "bin" and arg:
                return str(self.bin(arg))
            if kind == "model" and arg:
                return str(self.model(arg))
            if kind == "data" and arg:
                return str(self.data(arg))
            fixed = {"root": self.project_root, "gates": self.gates_dir, "build": self.build_dir, "work": self.work_dir}
            if kind in fixed and not arg:
                return str(fixed[kind])
            raise BadInput(f"gate {self.gate.name}: unknown placeholder {{{m.group(1)}}}")
        return re.sub(r"\{([a-z]+(?::[^{}]+)?)\}", one, text)


def run_gate(ctx: GateContext) -> dict:
    """Run one gate in its context; a failure inside becomes ok false with the error."""
    started = time.monotonic()
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    try:
        metrics = _module(ctx.gate.kind).run(ctx)
    except BadInput:
        raise
    except PolyforgeError as exc:
        verdict = judge(ctx.gate.name, {}, ctx.gate.thresholds)
        verdict.update(ok=False, error=exc.message, exit_code=exc.exit_code)
    else:
        verdict = judge(ctx.gate.name, metrics, ctx.gate.thresholds)
        if not verdict["ok"] and ctx.failure is not None:
            verdict["error"] = ctx.failure + (f": {ctx.failure_tail[-1]}" if ctx.failure_tail else "")
    if not verdict["ok"] and ctx.failure_tail:
        verdict["output_tail"] = ctx.failure_tail
    verdict["seconds"] = round(time.monotonic() - started, 2)
    return verdict
