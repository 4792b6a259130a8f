"""polyforge build|doctor|models|gate|bench|up"""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import build as build_lib
from ..chain import Chain
from ..console import err
from ..project import find_project
from . import app
from .render import emit_json, say


def run_build(chain: Chain, options: build_lib.BuildOptions, *, quiet: bool = False) -> build_lib.BuildResult:
    """Plan and run a build with a progress bar on stderr (shared by build, gate, up)."""
    with chain.locked():
        plan = build_lib.plan(chain, options)
    for note in plan.notes:
        say(f"[yellow]note[/] {note}")
    say(f"build {plan.key} -> {plan.build_dir}")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("[dim]{task.fields[what]}"), console=err, transient=True,
                   disable=quiet or not err.is_terminal)
    plain = {"last": -1}

    def on_progress(done: int, total: int, what: str) -> None:
        bar.update(task, completed=done, total=total, what=what[-60:])
        if not err.is_terminal and not quiet and total and (done * 10 // total) != plain["last"]:
            plain["last"] = done * 10 // total
            say(f"  [{done}/{total}] {what[:100]}")

    with bar:
        task = bar.add_task("building", total=None, what="")
        result = build_lib.run(plan, on_progress=on_progress)
    return result


@app.command()
def build(
    cuda: bool = typer.Option(False, "--cuda", help="Build the CUDA backend (GGML_CUDA=ON)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="CUDA architectures, e.g. 90 or 90,120 (default: the local GPU's)."),
    target: Optional[List[str]] = typer.Option(None, "--target", help="Build these targets instead of the defaults."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile jobs (ninja's default otherwise)."),
    build_type: str = typer.Option("Release", "--type", help="Release, Debug or RelWithDebInfo."),
    define: Optional[List[str]] = typer.Option(None, "-D", help="Extra CMake cache entry KEY=VALUE (part of the key)."),
    print_plan: bool = typer.Option(False, "--print-plan", help="Show the key, directory and cmake arguments; build nothing."),
    list_: bool = typer.Option(False, "--list", help="List the builds under build/."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Build the vendored tree (with the applied chain) out of tree, keyed by its inputs."""
    project = find_project()
    if list_:
        rows = build_lib.list_builds(project.build_root)
        if json_out:
            emit_json(rows)
            return
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("key", "state", "built at", "patches", "options", "artifacts"):
            table.add_column(col)
        for r in rows:
            opts = r.get("options") or {}
            desc = ("cuda " + ",".join(opts.get("archs", [])) if opts.get("cuda") else "cpu") + f" {opts.get('build_type', '')}"
            table.add_row(r["key"], r["state"], r.get("built_at") or "-", str(len(r.get("chain", []))),
                          desc if opts else "-", str(r.get("artifacts", "-")))
        err.print(table) if rows else say("no builds yet")
        return
    options = build_lib.BuildOptions.make(cuda=cuda, arch=arch, targets=target, build_type=build_type,
                                          defines=define, jobs=jobs)
    chain = Chain(project)
    if print_plan:
        with chain.locked():
            plan = build_lib.plan(chain, options)
        if json_out:
            emit_json(plan.as_dict())
        else:
            d = plan.as_dict()
            say(f"key        {d['key']}\nbuild dir  {d['build_dir']} ({'configured' if d['configured'] else 'new'})")
            say(f"chain      {len(d['inputs']['chain'])} applied patch(es), baseline {d['inputs']['baseline_tree'][:12]}")
            say(f"targets    {' '.join(d['targets'])}")
            say("cmake      " + " ".join(d["cache_args"]))
            for note in d["notes"]:
                say(f"note       {note}")
        return
    result = run_build(chain, options, quiet=json_out)
    if json_out:
        emit_json({"ok": True, "configured": result.configured, "seconds": round(result.seconds, 2), **result.manifest})
        return
    libs = [a for a in result.manifest["artifacts"] if a["kind"] == "library"]
    say(f"[green]ok[/] {result.plan.key}: {len(libs)} libraries, "
        f"{len(result.manifest['artifacts']) - len(libs)} binaries in {result.seconds:.1f} s"
        f"{' (configured)' if result.configured else ''}; manifest {result.plan.build_dir / build_lib.MANIFEST}")


# -- doctor --------------------------------------------------------------------------------
@app.command()
def doctor(json_out: bool = typer.Option(False, "--json")) -> None:
    """Python, cmake, ninja, compilers, nvcc, GPU, ccache, free disk: each ok or missing, with the fix."""
    from pathlib import Path
    from .. import doctor as doctor_lib
    from ..errors import BadInput
    try:
        root = find_project().build_root
    except BadInput:  # doctor also runs outside a project
        root = Path.cwd()
    results = doctor_lib.checks(root)
    ok = all(c.ok for c in results if c.required)
    if json_out:
        emit_json({"ok": ok, "checks": [c.as_dict() for c in results]})
    else:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("check", "state", "detail", "fix"):
            table.add_column(col)
        for c in results:
            state = "[green]ok[/]" if c.ok else ("[red]missing[/]" if c.required else "[yellow]missing[/]")
            table.add_row(c.name, state, c.detail, c.fix or "")
        err.print(table)
    raise typer.Exit(0 if ok else 3)


# -- models --------------------------------------------------------------------------------
models_app = typer.Typer(help="Models for gates and benchmarks (PyPI packages, sha256-checked, cached).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(json_out: bool = typer.Option(False, "--json")) -> None:
    """The registered models and whether they are cached."""
    from .. import models as models_lib
    rows = [models_lib.info(n) for n in models_lib.names()]
    if json_out:
        emit_json(rows)
        return
    for r in rows:
        say(f"{r['name']:<14} {'[green]cached[/]' if r['cached'] else 'not fetched'}  {r['description']}")
    say("[dim]random:SHAPE  a random-weight GGUF (polyforge.random_gguf), e.g. random:tiny[/]")


@models_app.command("fetch")
def models_fetch(
    names: List[str] = typer.Argument(..., help="gemma3-270m, or random:SHAPE"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="A folder with the wheels (no network)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Fetch (or generate) models into the cache; a cache hit costs nothing."""
    from pathlib import Path
    from .. import models as models_lib
    project = find_project()
    results = []
    for name in names:
        got = models_lib.fetch(name, find_links=Path(find_links) if find_links else None,
                               vendored_tree=project.tree_dir)
        results.append(got.as_dict())
        if not json_out:
            say(f"[green]ok[/] {name}: {'cached' if got.cached else 'fetched'} {got.path} (sha256 {got.sha256[:12]}, "
                f"{got.seconds:.1f} s)")
    if json_out:
        emit_json(results)


@models_app.command("path")
def models_path(name: str = typer.Argument(...)) -> None:
    """Print a cached model's path (stdout); exit 1 if it is not fetched."""
    from .. import models as models_lib
    info = models_lib.info(name)
    if not info["cached"]:
        say(f"[red]{name} is not fetched[/]: polyforge models fetch {name}")
        raise typer.Exit(1)
    print(info["path"])


# -- gates ---------------------------------------------------------------------------------
gate_app = typer.Typer(help="Gates: gates/*.yaml, each a build, models, commands, metrics and thresholds.",
                       no_args_is_help=True)
app.add_typer(gate_app, name="gate")


@gate_app.command("list")
def gate_list(json_out: bool = typer.Option(False, "--json")) -> None:
    """The gates of this project."""
    from ..gates import runner
    gates = runner.load_all(find_project().gates_dir)
    if json_out:
        emit_json([{"name": g.name, "kind": g.kind, "requires": g.build.requires, "models": list(g.models),
                    "description": g.description, "thresholds": list(g.thresholds)} for g in gates])
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("gate", "kind", "requires", "description"):
        table.add_column(col)
    for g in gates:
        table.add_row(g.name, g.kind, g.build.requires, g.description)
    err.print(table) if gates else say("no gates")


def _render_verdict(verdict: dict) -> None:
    # names, expressions and errors are data: "[q8_0/q8_0].kld_mean" must not be read as rich markup
    mark = "[green]PASS[/]" if verdict["ok"] else "[red]FAIL[/]"
    say(f"{mark} gate {escape(verdict['gate'])} (build {escape(str(verdict.get('build', '-')))}, "
        f"{verdict.get('seconds', 0):.1f} s)")
    if verdict.get("error"):
        say(f"  [red]error[/] {escape(verdict['error'])}")
    if verdict.get("output_tail"):
        say("  [dim]the failed command's last output lines:[/]")
        for line in verdict["output_tail"]:
            err.print(f"    {line}", markup=False, soft_wrap=True)
    for name, value in verdict["metrics"].items():
        if isinstance(value, dict):
            say(escape(f"  {name}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())))
        else:
            say(escape(f"  {name}: {_fmt(value)}"))
    for expr, result in verdict["thresholds"].items():
        state = "[green]ok[/]" if result["ok"] else "[red]FAIL[/]"
        extra = f" ({result['error']})" if result.get("error") else ""
        say(f"  {state} {escape(expr + extra)}")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return str(value)


def _build_fn(quiet: bool):
    return lambda chain, options: run_build(chain, options, quiet=quiet)


@gate_app.command("run")
def gate_run(
    name: str = typer.Argument(...),
    build_key: Optional[str] = typer.Option(None, "--build", help="Run against this existing build (key or prefix)."),
    cuda: bool = typer.Option(False, "--cuda", help="Build for CUDA (when not using --build)."),
    arch: Optional[str] = typer.Option(None, "--arch"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="Wheels folder for model packages."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Run one gate: build what it needs, fetch its models, run, judge. Exit 0 only when ok."""
    from pathlib import Path
    from .. import pipeline
    chain = Chain(find_project())
    options = build_lib.BuildOptions.make(cuda=cuda, arch=arch, jobs=jobs)
    verdict = pipeline.run_gate(chain, name, options=options, build_key=build_key,
                                log=lambda m: say(f"[dim]{m}[/]"), build_fn=_build_fn(json_out),
                                find_links=Path(find_links) if find_links else None)
    if json_out:
        emit_json(verdict)
    else:
        _render_verdict(verdict)
    raise typer.Exit(0 if verdict["ok"] else verdict.get("exit_code", 1))


# -- bench ---------------------------------------------------------------------------------
@app.command()
def bench(
    model: str = typer.Option("gemma3-270m", "--model", "-m", help="A model name (polyforge models list) or random:SHAPE."),
    kv: List[str] = typer.Option(["f16/f16,q8_0/q8_0,q4_0/q4_0"], "--kv", help="K/V pairs, comma-separated or repeated."),
    reference: Optional[str] = typer.Option(None, "--ref", help="Reference K/V pair for ratios (default: the first)."),
    depth: str = typer.Option("0,512", "--depth", "-d", help="Depths, comma-separated."),
    flags: Optional[List[str]] = typer.Option(None, "--flags", help="A llama-bench flag set, e.g. '-fa 1' (repeatable)."),
    n_prompt: int = typer.Option(0, "-p", help="Prompt tokens per test (0: none)."),
    n_gen: int = typer.Option(32, "-n", help="Generated tokens per test."),
    repetitions: int = typer.Option(3, "-r", help="Repetitions."),
    build_key: Optional[str] = typer.Option(None, "--build"),
    cuda: bool = typer.Option(False, "--cuda"),
    arch: Optional[str] = typer.Option(None, "--arch"),
    out: Optional[str] = typer.Option(None, "--out", help="Output folder (default build/KEY/bench/TIME)."),
    find_links: Optional[str] = typer.Option(None, "--find-links"),
    bandwidth: Optional[float] = typer.Option(None, "--bandwidth",
                                              help="Memory bandwidth in GB/s: add each decode row's roofline."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A llama-bench matrix: KV types x depths x flags; JSON, markdown, ratios, PNG (and rooflines)."""
    import time as _time
    from pathlib import Path
    from .. import bench as bench_lib
    from .. import models as models_lib
    try:
        depths = [int(d) for d in depth.split(",") if d.strip()]
    except ValueError:
        raise typer.BadParameter("--depth takes integers, e.g. 0,512,2048") from None
    spec = bench_lib.BenchSpec.make(kv, reference, depths, flags, n_prompt, n_gen, repetitions, bandwidth)
    project = find_project()
    chain = Chain(project)
    if build_key:
        manifest = build_lib.find_build(project.build_root, build_key)
    else:
        options = build_lib.BuildOptions.make(cuda=cuda, arch=arch, targets=["llama-bench"])
        manifest = run_build(chain, options, quiet=json_out).manifest
    exe = build_lib.binary(manifest, "llama-bench")
    fetched = models_lib.fetch(model, find_links=Path(find_links) if find_links else None,
                               vendored_tree=project.tree_dir)
    out_dir = Path(out) if out else Path(manifest["build_dir"]) / "bench" / _time.strftime("%Y%m%d-%H%M%S")
    result = bench_lib.run(exe, fetched.path, spec, out_dir, log=lambda m: say(f"[dim]{m}[/]"))
    result["build"] = manifest["key"]
    if json_out:
        emit_json(result)
        return
    err.print(bench_lib.markdown(result), markup=False)
    say(f"[green]ok[/] {len(result['rows'])} rows in {result['seconds']} s; " + ", ".join(result["files"].values()))


# -- up ------------------------------------------------------------------------------------
@app.command()
def up(
    cuda: bool = typer.Option(False, "--cuda", help="Build and gate with CUDA (GPU machines)."),
    arch: Optional[str] = typer.Option(None, "--arch"),
    gate: Optional[List[str]] = typer.Option(None, "--gate", help="Run these gates (default: every gate for this kind of build)."),
    no_gates: bool = typer.Option(False, "--no-gates", help="Stop after the build."),
    source: Optional[str] = typer.Option(None, "--source", help="Vendor source (see polyforge vendor fetch)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="Wheels folder for model packages."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """The whole pipeline: fetch -> apply -> verify-patches -> build -> gates; stops at the first failure."""
    from pathlib import Path
    from .. import pipeline
    chain = Chain(find_project())
    options = build_lib.BuildOptions.make(cuda=cuda, arch=arch, jobs=jobs)

    def on_step(step) -> None:
        if json_out:
            return
        mark = "[green]ok[/]" if step.ok else "[red]FAILED[/]"
        say(f"{mark} {step.name} ({step.seconds:.1f} s)" + (f": {step.error}" if step.error else ""))
        if "verdict" in step.detail:
            _render_verdict(step.detail["verdict"])

    result = pipeline.up(chain, options=options, gates=[] if no_gates else gate, source=source,
                         log=lambda m: None if json_out else say(f"[dim]{m}[/]"), build_fn=_build_fn(json_out),
                         find_links=Path(find_links) if find_links else None, on_step=on_step,
                         run_gates=not no_gates)
    if json_out:
        emit_json(result.as_dict())
    elif result.ok:
        say(f"[green]ok[/] pipeline passed: {len(result.steps)} steps")
    raise typer.Exit(result.exit_code)
