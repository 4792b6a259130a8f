"""Gates: gates/NAME.yaml declares a build, models, commands, metrics and thresholds;
running one yields a Verdict (JSON: {"gate", "ok", "metrics", "thresholds", ...}). A failed
gate's verdict also says why: "error" (one line) and, when a command failed, "output_tail"
(the last lines of its stderr, or of its stdout when stderr is empty).

What runs a gate is its kind: polyforge.gates.kinds registers them and its docstring says
how to add one.

Schema (validated into the dataclasses below):

    name: turbo-kld             # equals the file's stem
    kind: perplexity-kld        # a key of kinds.KINDS
    description: one line
    build:                      # optional
      targets: [llama-perplexity]   # binaries it needs (built if missing)
      requires: any             # any | cpu | cuda: where the gate makes sense
    models: [gemma3-270m]       # fetched (and sha256-checked) before it runs
    timeout: 1800               # seconds, per command
    env: {GGML_CUDA_X: "1"}     # optional: environment of every command it runs
    params: {...}               # the kind's own, validated by its validate_params
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
import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .. import proc, schema
from ..errors import BadInput, PolyforgeError, VerificationFailed
from ..kvtypes import dominates
from ._common import output_tail
from .kinds import KINDS, Metrics

REQUIRES = ("any", "cpu", "cuda")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF = re.compile(r"\[([^\[\]*]+)\]\.([A-Za-z_][A-Za-z0-9_]*)")
_FUNCS = ("min", "max", "abs", "len", "dominates")
_KEYS = ("name", "kind", "description", "build", "models", "params", "thresholds", "timeout", "env")


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
        top = schema.mapping(schema.load_yaml(path), where)
    except FileNotFoundError:
        raise BadInput(f"{where}: not found") from None
    schema.only(top, _KEYS, where)
    name = top.get("name")
    if name != path.stem:
        raise BadInput(f"{where}: 'name' must be the file's stem '{path.stem}' (got {name!r})")
    kind = schema.choice(top, "kind", KINDS, where)
    build = schema.optional(top, "build", dict, where, {})
    schema.only(build, ("targets", "requires"), where, section="build")
    targets = schema.str_list(build, "targets", where, section="build")
    requires = schema.choice(build, "requires", REQUIRES, where, "any", section="build")
    models = tuple(schema.str_list(top, "models", where))
    thresholds = schema.str_list(top, "thresholds", where, required=True)
    for expr in thresholds:
        try:
            compile_expr(expr)
        except BadInput as exc:
            raise BadInput(f"{where}: threshold {expr!r}: {exc.message}") from None
    timeout = schema.optional(top, "timeout", (int, float), where, 1800)
    if timeout <= 0:
        raise BadInput(f"{where}: 'timeout' must be a positive number of seconds")
    env = schema.str_map(top, "env", where, key_pattern=_ENV_NAME)
    params = KINDS[kind].validate_params(schema.optional(top, "params", dict, where, {}), where, models)
    return Gate(name, kind, schema.optional(top, "description", str, where, ""), GateBuild(tuple(targets), requires),
                models, params, tuple(thresholds), float(timeout), path, tuple(env.items()))


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
            if dominates(tuple(va), tuple(vb)):
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


@dataclass(frozen=True)
class Verdict:
    """A gate's result; as_dict() is its JSON (`polyforge gate run --json`, `up --json`)."""

    gate: str
    ok: bool
    metrics: Metrics
    thresholds: dict[str, dict]  # expression -> evaluate()'s {"ok", "values"[, "error"]}
    error: str | None = None  # one line: why it failed
    error_exit_code: int | None = None  # set when an error stopped the run before it was judged
    output_tail: tuple[str, ...] = ()  # the failed command's last output lines (failed gates only)
    seconds: float = 0.0
    build: str | None = None  # the build's key, and its live tree id (pipeline.run_gate)
    live_tree: str | None = None
    reused_from: str | None = None  # when the recorded verdict of that time was reused (gates.record)

    @property
    def exit_code(self) -> int:
        """0 when ok; else the error's exit code, or 1 when thresholds failed."""
        if self.ok:
            return 0
        return self.error_exit_code if self.error_exit_code is not None else VerificationFailed.exit_code

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"gate": self.gate, "ok": self.ok, "metrics": self.metrics,
                               "thresholds": self.thresholds}
        if self.error is not None:
            out["error"] = self.error
        if self.error_exit_code is not None:
            out["exit_code"] = self.error_exit_code
        if self.output_tail:
            out["output_tail"] = list(self.output_tail)
        out["seconds"] = self.seconds
        if self.build is not None:
            out["build"] = self.build
            out["live_tree"] = self.live_tree
        if self.reused_from is not None:
            out["reused_from"] = self.reused_from
        return out

    @staticmethod
    def from_dict(data: dict, *, reused_from: str | None = None) -> "Verdict":
        """The verdict as_dict() wrote (a recorded one, gates.record)."""
        return Verdict(str(data["gate"]), bool(data["ok"]), dict(data["metrics"]), dict(data["thresholds"]),
                       data.get("error"), data.get("exit_code"), tuple(data.get("output_tail", ())),
                       float(data.get("seconds", 0.0)), data.get("build"), data.get("live_tree"), reused_from)


def judge(gate_name: str, metrics: Metrics, thresholds: tuple[str, ...] | list[str]) -> Verdict:
    results = {expr: evaluate(expr, metrics) for expr in thresholds}
    return Verdict(gate_name, all(r["ok"] for r in results.values()), metrics, results)


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
    # the build's binaries the gate asked for (bin() and {bin:NAME}): what its verdict was judged on
    binaries_used: set[str] = field(default_factory=set)

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
        self.binaries_used.add(name)
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


def execute(ctx: GateContext) -> Verdict:
    """Run one gate in its context; an error inside (but BadInput) becomes ok false with the error."""
    started = time.monotonic()
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    error: str | None = None
    error_exit_code: int | None = None
    try:
        metrics = KINDS[ctx.gate.kind].run(ctx)
    except BadInput:  # the gate's own files are wrong: no verdict
        raise
    except PolyforgeError as exc:
        metrics, error, error_exit_code = {}, exc.message, exc.exit_code
    verdict = judge(ctx.gate.name, metrics, ctx.gate.thresholds)
    ok = verdict.ok and error is None
    if not ok and error is None and ctx.failure is not None:
        error = ctx.failure + (f": {ctx.failure_tail[-1]}" if ctx.failure_tail else "")
    return replace(verdict, ok=ok, error=error, error_exit_code=error_exit_code,
                   output_tail=() if ok else tuple(ctx.failure_tail), seconds=round(time.monotonic() - started, 2))
