"""polyforge rebase | upstream check"""

from __future__ import annotations

from typing import List, Optional, TYPE_CHECKING

import typer
from rich.markup import escape

from polyforge.errors import BadInput
from ..project import find_project
from . import app
from .render import emit_json, say

if TYPE_CHECKING:  # the library loads when a command runs, so that --help and errors start fast
    from polyforge.chain import rebase as rebase_lib

upstream_app = typer.Typer(no_args_is_help=True, help="Follow upstream: check newer trees against the chain.")
app.add_typer(upstream_app, name="upstream")

_STYLE = {"exact": "green", "offsets": "green", "three-way": "yellow", "partly-upstream": "yellow",
          "upstream": "cyan", "resolved": "yellow", "skipped": "red", "conflict": "red", "pending": "dim"}


@app.command()
def rebase(
    onto: Optional[str] = typer.Option(None, "--onto", help="The new upstream tree: a source spelling "
                                       "(pypi-sdist:NAME==VER[#subdir], git:URL@REV, archive:..., dir:..., a path)."),
    release: Optional[str] = typer.Option(None, "--release", help="The new tree's release name (e.g. b11549)."),
    commit: Optional[str] = typer.Option(None, "--commit", help="Its upstream commit id, when known."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Classify and review; move nothing."),
    continue_: bool = typer.Option(False, "--continue", help="Capture the resolved conflict and go on."),
    skip: bool = typer.Option(False, "--skip", help="Drop the conflicting patch and go on."),
    abort: bool = typer.Option(False, "--abort", help="Put back the old pin, patches and tree."),
    force: bool = typer.Option(False, "--force", help="Take a source that does not look like a llama.cpp tree."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Carry the chain onto another upstream tree: each patch classified and reviewed."""
    from polyforge.chain import rebase as rebase_lib
    from polyforge.chain.engine import Chain
    actions = [name for name, on in (("--continue", continue_), ("--skip", skip), ("--abort", abort)) if on]
    if len(actions) > 1 or (actions and (onto or dry_run or force)):
        raise BadInput("give --onto [--dry-run] [--force], or one of --continue, --skip, --abort")
    chain = Chain(find_project())
    log = (lambda m: None) if json_out else (lambda m: say(f"[dim]{escape(m)}[/]"))
    if actions:
        with chain.exclusive(rebasing=True):
            report = rebase_lib.resume(chain, actions[0][2:], log)
    elif onto is None:
        raise BadInput("--onto SOURCE is required (or --continue, --skip, --abort)")
    elif dry_run:
        with chain.shared():
            report = rebase_lib.dry_run(chain, onto, release=release, force=force, log=log)
    else:
        if release is None:
            raise BadInput("--release NAME is required to move the pin (e.g. --release b11549)")
        with chain.exclusive():
            report = rebase_lib.start(chain, onto, release=release, commit=commit, force=force, log=log)
    _render(report, json_out, aborted=abort)
    raise typer.Exit(0 if report.clean or abort else 1)


def _render(report: rebase_lib.Report, json_out: bool, aborted: bool = False) -> None:
    if json_out:
        emit_json(report.as_dict())
        return
    if aborted:
        say("[green]ok[/] rebase aborted: pin, patches and vendored tree are back as they were")
        return
    say(f"onto {escape(report.onto)}: tree {report.new_tree[:12]} (from {report.old_tree[:12]})")
    if report.note:
        say(f"[yellow]note[/] {escape(report.note)}")
    for outcome in report.outcomes:
        style = _STYLE.get(outcome.status, "white")
        say(f"  {outcome.name}: [{style}]{outcome.status}[/] {escape(outcome.detail)}")
        for finding in outcome.findings:
            first, *rest = finding.detail.splitlines() or [""]
            say(f"    [yellow]review[/] {finding.kind}: {escape(first)}")
            for line in rest:
                say(f"      [dim]{escape(line)}[/]")
    conflict = report.first_conflict
    if conflict is not None and not report.dry_run:
        say(f"[red]stopped[/] at {conflict.name}: resolve the conflicts in vendor/llama.cpp, then "
            "polyforge rebase --continue (or --skip, --abort)")
    elif conflict is not None:
        say(f"[red]conflict[/] first at {conflict.name} (dry run: nothing moved){_knock_on(report)}")
    elif report.done:
        say("[green]ok[/] rebased: pin.yaml, patches/ and chain.lock moved; the old pin is in vendor/pin-history.yaml")
    else:
        say(f"[green]ok[/] the chain goes clean ({report.seconds:.1f} s; dry run: nothing moved)")


def _knock_on(report: rebase_lib.Report) -> str:
    conflicts = sum(1 for o in report.outcomes if o.status == "conflict")
    if not report.knock_on_conflicts:
        return f"; {conflicts} conflict(s)"
    return (f"; {conflicts} conflict(s) forecast, {report.knock_on_conflicts} of them maybe knock-ons of an "
            "earlier conflict (they touch what it changes)")


@upstream_app.command("check")
def check(
    sources: List[str] = typer.Argument(..., help="Source spellings, newest first."),
    force: bool = typer.Option(False, "--force", help="Take sources that do not look like a llama.cpp tree."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Dry-run the rebase onto each source: the newest that goes clean, the first conflict on others."""
    from polyforge.chain import rebase as rebase_lib
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    log = (lambda m: None) if json_out else (lambda m: say(f"[dim]{escape(m)}[/]"))
    with chain.shared():
        result = rebase_lib.upstream_check(chain, sources, log, force=force,
                                           on_report=None if json_out else _say_checked)
    if json_out:
        emit_json(result.as_dict())
    else:
        newest = result.newest_clean
        say(f"newest clean: {escape(newest)}" if newest else "[red]no source goes clean[/]")
    failure = result.failure()
    if failure is not None:
        raise failure  # after every result is out: one source failing loses no other's
    raise typer.Exit(0 if result.ok else 1)


def _say_checked(report: rebase_lib.Report) -> None:
    conflict = report.first_conflict
    if report.failure is not None:
        state = f"[red]failed[/]: {escape(report.failure.message)}"
    elif report.clean:
        state = "[green]clean[/]"
    else:
        state = f"[red]conflict[/] at {conflict.name if conflict else '?'}{_knock_on(report)}"
    say(f"  {escape(report.onto)}: {state} ({report.seconds:.1f} s)")
    if report.note:
        say(f"    [yellow]note[/] {escape(report.note)}")
