"""polyforge gate list|run"""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ..console import err
from ..project import find_project
from . import app
from .render import build_and_model_args, emit_json, render_verdict, say

gate_app = typer.Typer(help="Gates: gates/*.yaml, each a build, models, commands, metrics and thresholds.",
                       no_args_is_help=True)
app.add_typer(gate_app, name="gate")


@gate_app.command("list")
def gate_list(json_out: bool = typer.Option(False, "--json")) -> None:
    """The gates of this project."""
    from polyforge.gates import runner
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


@gate_app.command("run")
def gate_run(
    name: str = typer.Argument(...),
    build_key: Optional[str] = typer.Option(None, "--build", help="Run against this existing build (key or prefix)."),
    cuda: bool = typer.Option(False, "--cuda", help="Build for CUDA (when not using --build)."),
    arch: Optional[str] = typer.Option(None, "--arch"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="Wheels folder for model packages."),
    rerun: bool = typer.Option(False, "--rerun", help="Run it even when it passed on the same inputs before."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Run one gate: build what it needs, fetch its models, run, judge. Exit 0 only when ok. A
    passing verdict recorded on the same build, gate files, models and polyforge is reused."""
    from polyforge import pipeline
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    verdict = pipeline.run_gate(chain, name, build_key=build_key, log=lambda m: say(f"[dim]{m}[/]"), rerun=rerun,
                                **build_and_model_args(cuda=cuda, arch=arch, jobs=jobs, find_links=find_links,
                                                       quiet=json_out))
    if json_out:
        emit_json(verdict.as_dict())
    else:
        render_verdict(verdict.as_dict())
    raise typer.Exit(verdict.exit_code)
