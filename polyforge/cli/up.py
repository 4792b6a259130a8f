"""polyforge up"""

from __future__ import annotations

from typing import List, Optional

import typer

from ..project import find_project
from . import app
from .render import build_and_model_args, emit_json, render_verdict, say


@app.command()
def up(
    cuda: bool = typer.Option(False, "--cuda", help="Build and gate with CUDA (GPU machines)."),
    arch: Optional[str] = typer.Option(None, "--arch"),
    gate: Optional[List[str]] = typer.Option(None, "--gate", help="Run these gates (default: every gate for this kind of build)."),
    no_gates: bool = typer.Option(False, "--no-gates", help="Stop after the build."),
    rerun: bool = typer.Option(False, "--rerun", help="Run every gate, even one that passed on the same inputs before."),
    source: Optional[str] = typer.Option(None, "--source", help="Vendor source (see polyforge vendor fetch)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="Wheels folder for model packages."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """The whole pipeline: fetch -> apply -> verify-patches -> build -> gates; stops at the first failure."""
    from polyforge import pipeline
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())

    def on_step(step: pipeline.Step) -> None:
        if json_out:
            return
        mark = "[green]ok[/]" if step.ok else "[red]FAILED[/]"
        say(f"{mark} {step.name} ({step.seconds:.1f} s)" + (f": {step.error}" if step.error else ""))
        if "verdict" in step.detail:
            render_verdict(step.detail["verdict"])

    result = pipeline.up(chain, gates=[] if no_gates else gate, source=source,
                         log=lambda m: None if json_out else say(f"[dim]{m}[/]"), on_step=on_step,
                         run_gates=not no_gates, rerun=rerun,
                         **build_and_model_args(cuda=cuda, arch=arch, jobs=jobs, find_links=find_links,
                                                quiet=json_out))
    if json_out:
        emit_json(result.as_dict())
    elif result.ok:
        say(f"[green]ok[/] pipeline passed: {len(result.steps)} steps")
    raise typer.Exit(result.exit_code)
