"""Shared rendering: JSON to stdout, rich to stderr; a build's progress; a gate's verdict."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..console import err

if TYPE_CHECKING:  # the library loads when a command runs, so that --help and errors start fast
    from polyforge.chain.engine import Chain
    from ..pipeline import BuildFn


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def say(message: str) -> None:
    err.print(message, soft_wrap=True)


@contextmanager
def exclusive_saying_notices(chain: Chain) -> Iterator[None]:
    """chain.exclusive(), first saying what it recovered (a dead run's leftovers, an interrupted
    run's journal), for the commands that move the vendored tree."""
    with chain.exclusive() as notices:
        for notice in notices:
            say(f"[yellow]{notice}[/]")
        yield


def build_with_progress(quiet: bool) -> BuildFn:
    """build_lib.build showing the plan and a progress bar on stderr (quiet: no bar), for the
    commands that build: build, gate run, bench, up."""
    from polyforge.build import builder as build_lib

    def build(chain: Chain, options: build_lib.BuildOptions) -> build_lib.BuildResult:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("[dim]{task.fields[what]}"), console=err, transient=True,
                       disable=quiet or not err.is_terminal)
        task = bar.add_task("building", total=None, what="")
        tenths = {"last": -1}  # without a terminal: a line per tenth done

        def on_plan(plan: build_lib.Plan) -> None:
            for note in plan.notes:
                say(f"[yellow]note[/] {note}")
            say(f"build {plan.key} -> {plan.build_dir}")
            bar.start()

        def on_progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, what=what[-60:])
            if not err.is_terminal and not quiet and total and (done * 10 // total) != tenths["last"]:
                tenths["last"] = done * 10 // total
                say(f"  [{done}/{total}] {what[:100]}")

        def on_warning(text: str) -> None:
            bar.stop()  # a line of its own, not under the bar
            say(f"[yellow]warning:[/] {escape(text)}")
            bar.start()

        try:
            result = build_lib.build(chain, options, on_plan=on_plan, on_progress=on_progress, on_warning=on_warning)
        finally:
            bar.stop()
        if result.cache is not None:
            say(f"compiler cache: {escape(result.cache.summary())}")
        return result
    return build


@contextmanager
def step_progress(quiet: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on stderr over a run's steps: yields on_progress(done, total, what); without a
    terminal, a line per step (quiet: nothing)."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("[dim]{task.fields[what]}"), console=err, transient=True,
                   disable=quiet or not err.is_terminal)
    task = bar.add_task("measuring", total=None, what="")

    def on_progress(done: int, total: int, what: str) -> None:
        bar.update(task, completed=done, total=total, what=what[-60:])
        if not err.is_terminal and not quiet and done < total:
            say(escape(f"  [{done + 1}/{total}] {what[:100]}"))

    with bar:
        yield on_progress


def build_and_model_args(*, cuda: bool, arch: Optional[str], jobs: Optional[int], find_links: Optional[str],
                         quiet: bool) -> dict:
    """The keyword arguments pipeline.run_gate and pipeline.up take from the flags gate run and up
    share: what to build, how to show the build, where model wheels are."""
    from polyforge.build import builder as build_lib
    return {"options": build_lib.BuildOptions.make(cuda=cuda, arch=arch, jobs=jobs),
            "build_fn": build_with_progress(quiet=quiet),
            "find_links": Path(find_links) if find_links else None}


def render_verdict(verdict: dict) -> None:
    """A gate's verdict (its as_dict) on stderr, for gate run and up."""
    # names, expressions and errors are data: "[q8_0/q8_0].kld_mean" must not be read as rich markup
    mark = "[green]PASS[/]" if verdict["ok"] else "[red]FAIL[/]"
    reused = f", the verdict of {escape(verdict['reused_from'])}" if verdict.get("reused_from") else ""
    say(f"{mark} gate {escape(verdict['gate'])} (build {escape(str(verdict.get('build', '-')))}, "
        f"{verdict.get('seconds', 0):.1f} s{reused})")
    if verdict.get("error"):
        say(f"  [red]error[/] {escape(verdict['error'])}")
    if verdict.get("output_tail"):
        say("  [dim]the failed command's last output lines:[/]")
        for line in verdict["output_tail"]:
            err.print(f"    {line}", markup=False, soft_wrap=True)
    for name, value in verdict["metrics"].items():
        if isinstance(value, dict):
            say(escape(f"  {name}: " + ", ".join(f"{k}={_metric(v)}" for k, v in value.items())))
        else:
            say(escape(f"  {name}: {_metric(value)}"))
    for expr, result in verdict["thresholds"].items():
        state = "[green]ok[/]" if result["ok"] else "[red]FAIL[/]"
        extra = f" ({result['error']})" if result.get("error") else ""
        say(f"  {state} {escape(expr + extra)}")


def _metric(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return str(value)
