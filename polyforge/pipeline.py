"""The orchestration above the engine: a gate or a bench with its build and models, and `up`,
the whole pipeline: fetch -> apply -> verify-patches -> build -> gates, stopping at the first
failure. Each takes the project lock where it touches the vendored tree (build_lib.plan does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from polyforge.bench import agents as agents_lib
from polyforge.bench import bandwidth as bandwidth_lib
from polyforge.bench import kld as kld_lib
from polyforge.bench import matrix as bench_lib
from polyforge.build import builder as build_lib
from polyforge.models import registry as models_lib
from polyforge.upstream import vendor as vendor_lib
from polyforge.chain import verify as verify_lib
from polyforge.chain.engine import Chain
from .errors import BadInput, PolyforgeError, VerificationFailed
from .gates import record, runner

Log = Callable[[str], None]
BuildFn = Callable[[Chain, build_lib.BuildOptions], build_lib.BuildResult]


def _quiet(message: str) -> None:
    pass


def default_build(chain: Chain, options: build_lib.BuildOptions) -> build_lib.BuildResult:
    """A build with no progress shown (the CLI passes one that shows it)."""
    return build_lib.build(chain, options)


def gate_options(gate: runner.Gate, options: build_lib.BuildOptions) -> build_lib.BuildOptions:
    """The run's options, building only what the gate needs (same key: targets are not in it)."""
    targets = gate.build.targets or options.targets
    return build_lib.BuildOptions(options.cuda, options.archs, tuple(targets), options.build_type,
                                  options.defines, options.jobs)


def run_gate(chain: Chain, name: str, *, options: build_lib.BuildOptions | None = None, build_key: str | None = None,
             log: Log = _quiet, build_fn: BuildFn = default_build, find_links: Path | None = None,
             rerun: bool = False) -> runner.Verdict:
    """Build (incrementally, or take --build KEY as it is), fetch models, run, judge. A passing
    verdict recorded on the same inputs (gates.record) is reused unless rerun."""
    project = chain.project
    gate = runner.find(project.gates_dir, name)
    options = options or build_lib.BuildOptions()
    if build_key is not None:
        manifest = build_lib.find_build(project.build_root, build_key)
        cuda = manifest.cuda
        for target in gate.build.targets:
            manifest.binary(target)  # present, or a clear error
    else:
        cuda = options.cuda
        if not gate.applies_to(cuda):
            raise BadInput(f"gate {name} needs a {gate.build.requires} build",
                           hint="--cuda" if gate.build.requires == "cuda" else "run it without --cuda")
        log(f"gate {name}: building {' '.join(gate.build.targets) or 'the default targets'}")
        manifest = build_fn(chain, gate_options(gate, options)).manifest
    if not gate.applies_to(cuda):
        raise BadInput(f"gate {name} needs a {gate.build.requires} build; build {manifest.key} is not one")
    paths, digests = {}, {}
    for model in gate.models:
        fetched = models_lib.fetch(model, find_links=find_links, vendored_tree=chain.tree.path)
        log(f"model {model}: {'cached' if fetched.cached else 'fetched'} {fetched.path}")
        paths[model], digests[model] = fetched.path, fetched.sha256
    build_dir = manifest.build_dir
    work_dir = build_dir / "gates" / name
    inputs = record.gate_inputs(gate, project_root=project.root, gates_dir=project.gates_dir, build_dir=build_dir,
                                build_key=manifest.key, live_tree=manifest.live_tree, models=digests,
                                env=dict(gate.env))
    if not rerun:
        kept = record.load_passing(work_dir, inputs, build_dir)
        if kept is not None:
            log(f"gate {name}: passed on the same inputs at {kept.reused_from}; that verdict stands "
                "(--rerun runs it again)")
            return kept
    ctx = runner.GateContext(gate=gate, build_dir=build_dir, work_dir=work_dir, gates_dir=project.gates_dir,
                             project_root=project.root, models=paths, log=log, env=dict(gate.env))
    verdict = replace(runner.execute(ctx), build=manifest.key, live_tree=manifest.live_tree)
    record.save(work_dir, inputs, verdict, record.binaries(build_dir, ctx.binaries_used))
    return verdict


# -- bench ---------------------------------------------------------------------------------
def run_bench(chain: Chain, spec: bench_lib.BenchSpec, *, model: str, options: build_lib.BuildOptions | None = None,
              build_key: str | None = None, out_dir: Path | None = None, log: Log = _quiet,
              build_fn: BuildFn = default_build, find_links: Path | None = None) -> bench_lib.BenchResult:
    """Build llama-bench (incrementally, or take --build KEY as it is), fetch the model, run the
    matrix into out_dir (default build/KEY/bench/TIME)."""
    return _measure(chain, "llama-bench", bench_lib.run, spec, model=model, options=options, build_key=build_key,
                    out_dir=out_dir, log=log, build_fn=build_fn, find_links=find_links)


def run_agents(chain: Chain, spec: agents_lib.AgentsSpec, *, model: str, **kw) -> agents_lib.AgentsResult:
    """The agents scenario, with run_bench's keywords: build llama-batched-bench (incrementally, or
    take --build KEY), fetch the model, run each prefix and KV pair for B agents into out_dir."""
    return _measure(chain, agents_lib.TOOL, agents_lib.run, spec, model=model, **kw)


def run_kld(chain: Chain, spec: kld_lib.KldSpec, *, model: str, progress: kld_lib.Progress | None = None,
            **kw) -> kld_lib.KldResult:
    """bench --kld, with run_bench's keywords: build llama-perplexity (and llama-bench for depths),
    take the model (registered or a GGUF path), measure each K/V pair into out_dir."""
    tools = ("llama-perplexity", "llama-bench") if spec.depths else ("llama-perplexity",)

    def run(perplexity_bin, *rest, bandwidth, log):
        bench_bin, (model_path, _, out_dir) = (rest[0], rest[1:]) if spec.depths else (None, rest)
        return kld_lib.run(perplexity_bin, bench_bin, model_path, spec, out_dir, log=log,
                           **({"progress": progress} if progress else {}))
    return _measure(chain, tools, run, spec, model=model, **kw)


def _measure(chain: Chain, tools: str | tuple[str, ...], run: Callable, spec, *, model: str,
             options: build_lib.BuildOptions | None = None, build_key: str | None = None, out_dir: Path | None = None,
             log: Log = _quiet, build_fn: BuildFn = default_build, find_links: Path | None = None):
    """What the bench modes share: the tools' build, the model (registered, or a GGUF file's path),
    run(*exes, model, spec, out_dir, log=log)."""
    tools = (tools,) if isinstance(tools, str) else tools
    project = chain.project
    if build_key is not None:
        manifest = build_lib.find_build(project.build_root, build_key)
    else:
        options = options or build_lib.BuildOptions()
        manifest = build_fn(chain, replace(options, targets=tools)).manifest
    exes = [manifest.binary(tool) for tool in tools]
    fetched = models_lib.fetch_or_local(model, find_links=find_links, vendored_tree=chain.tree.path)
    log(f"model {model}: {'cached' if fetched.cached else 'fetched'} {fetched.path}")
    out_dir = out_dir or manifest.build_dir / "bench" / time.strftime("%Y%m%d-%H%M%S")
    bandwidth = None
    if getattr(spec, "bandwidth", None) == "auto":  # the matrix and agents specs; bench --kld has none
        bandwidth = bandwidth_lib.measure(cuda=manifest.cuda, work_dir=manifest.build_dir / "probes")
        log(f"memory bandwidth: {bandwidth.describe()}")
    result = run(*exes, fetched.path, spec, out_dir, bandwidth=bandwidth, log=log)
    result.build = manifest.key
    return result


# -- up ------------------------------------------------------------------------------------
@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: dict = field(default_factory=dict)
    error: str | None = None
    exit_code: int = 0


@dataclass
class UpResult:
    steps: list[Step]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)

    @property
    def exit_code(self) -> int:
        return next((s.exit_code for s in self.steps if not s.ok), 0)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "exit_code": self.exit_code,
                "steps": [{"step": s.name, "ok": s.ok, "seconds": round(s.seconds, 2), "error": s.error, **s.detail}
                          for s in self.steps]}


def selected_gates(chain: Chain, names: list[str] | None, cuda: bool) -> list[str]:
    """The named gates (checked to exist), or every gate that applies to this kind of build."""
    if names:
        for name in names:
            runner.find(chain.project.gates_dir, name)
        return names
    return [g.name for g in runner.load_all(chain.project.gates_dir) if g.applies_to(cuda)]


def up(chain: Chain, *, options: build_lib.BuildOptions, gates: list[str] | None = None, source: str | None = None,
       log: Log = _quiet, build_fn: BuildFn = default_build, find_links: Path | None = None,
       on_step: Callable[[Step], None] | None = None, run_gates: bool = True, rerun: bool = False) -> UpResult:
    """fetch -> apply -> verify-patches -> build -> gates; stops at the first failure."""
    names = selected_gates(chain, gates, options.cuda) if run_gates else []  # bad names fail before any work
    steps: list[Step] = []

    def step(name: str, action: Callable[[], tuple[int, dict, str | None]]) -> bool:
        """action() -> (exit code: 0 when the step passed, detail, error)."""
        started = time.monotonic()
        log(f"== {name}")
        try:
            code, detail, error = action()
        except PolyforgeError as exc:
            code, detail, error = exc.exit_code, {}, exc.message
        ok = code == 0
        result = Step(name, ok, time.monotonic() - started, detail, error, code)
        steps.append(result)
        if on_step is not None:
            on_step(result)
        return ok

    def do_fetch():
        with chain.exclusive():
            fetched = vendor_lib.fetch(chain, source=source, force=False)
        return 0, {"tree": fetched.tree, "already": fetched.already}, None

    def do_apply():
        with chain.exclusive():
            report = chain.apply(to=None)
        return 0, {"applied": [r["name"] for r in report if r["status"] == "applied"],
                   "already": [r["name"] for r in report if r["status"] != "applied"]}, None

    def do_verify():
        with chain.exclusive():
            proof = verify_lib.verify(chain)
        problems = proof.problems + [f"{p.name}: {q}" for p in proof.patches for q in p.problems]
        code = 0 if proof.ok else VerificationFailed.exit_code
        return code, {"patches": len(proof.patches)}, (problems[0] if problems else None)

    def do_build():
        result = build_fn(chain, options)
        return 0, {"key": result.plan.key, "configured": result.configured,
                   "build_seconds": round(result.seconds, 2)}, None

    def gate_action(name: str):
        def action():
            verdict = run_gate(chain, name, options=options, log=log, build_fn=build_fn, find_links=find_links,
                               rerun=rerun)
            failing = [e for e, r in verdict.thresholds.items() if not r["ok"]]
            error = verdict.error or (f"threshold failed: {failing[0]}" if failing else None)
            return verdict.exit_code, {"verdict": verdict.as_dict()}, error
        return action

    plan = [("fetch", do_fetch), ("apply", do_apply), ("verify-patches", do_verify), ("build", do_build)]
    plan += [(f"gate {n}", gate_action(n)) for n in names]
    for name, action in plan:
        if not step(name, action):
            break
    return UpResult(steps)
