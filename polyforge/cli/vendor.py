"""polyforge vendor fetch|status|pack"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..project import find_project
from . import app
from .render import emit_json, exclusive_saying_notices, say

vendor_app = typer.Typer(help="The pinned upstream llama.cpp tree (vendor/llama.cpp).", no_args_is_help=True)
app.add_typer(vendor_app, name="vendor")


@vendor_app.command("fetch")
def fetch(
    source: Optional[str] = typer.Option(None, "--source", help="A source name from vendor/pin.yaml, a folder or archive path, or "
                                         "pypi-sdist:NAME==VER[#subdir], git:URL@REV, archive:PATH_OR_URL[#subdir], dir:PATH."),
    force: bool = typer.Option(False, "--force", help="Re-vendor; an edited tree is moved to vendor/backups/ first."),
    json_out: bool = typer.Option(False, "--json", help="Machine output on stdout."),
) -> None:
    """Fetch the pinned llama.cpp, prove its tree id, and vendor it."""
    from polyforge.chain.engine import Chain
    from polyforge.upstream import vendor as vendor_lib
    chain = Chain(find_project())
    with exclusive_saying_notices(chain):
        result = vendor_lib.fetch(chain, source, force)
    if json_out:
        emit_json(result.as_dict())
        return
    for skipped in result.skipped:
        say(f"[yellow]skipped[/] {skipped}")
    if result.backup:
        say(f"[yellow]the previous tree had edits or applied patches; it was moved to {result.backup}[/]")
    if result.already:
        say(f"[green]ok[/] vendor/llama.cpp is already the pinned baseline ({result.tree[:12]})")
    else:
        say(f"[green]ok[/] vendored {chain.pin.project} {chain.pin.release} from {result.source}: tree {result.tree[:12]}"
            f"{' (pruned pack)' if result.pruned else ''} in {result.seconds:.1f} s")


@vendor_app.command("status")
def status(json_out: bool = typer.Option(False, "--json")) -> None:
    """The pin and whether the vendored baseline matches it."""
    from polyforge.chain import rebase as rebase_lib
    from polyforge.chain.engine import Chain
    from polyforge.upstream import vendor as vendor_lib
    chain = Chain(find_project())
    info = vendor_lib.status(chain, rebase_lib.describe(chain.project))
    if json_out:
        emit_json(info)
    else:
        say(f"pin: {chain.pin.project} {chain.pin.label} tree {info['pin']['tree'][:12]}")
        if info.get("rebase"):
            say(f"[red]rebase[/] in progress: {escape(info['rebase']['needs'])}")
        elif not info["vendored"]:
            say("[red]not vendored[/]: run polyforge vendor fetch")
        if info["vendored"]:
            mark = "[green]ok[/]" if info["baseline_ok"] else "[red]MISMATCH[/]"
            say(f"baseline: {info['baseline_tree'][:12]} {mark} from {info.get('source')}{' (pruned)' if info['pruned'] else ''}")
    raise typer.Exit(0 if info["ok"] else 1)


@vendor_app.command("pack")
def pack(
    out: Path = typer.Argument(..., help="Output .tar.xz"),
    patched: bool = typer.Option(False, "--patched", help="Pack the live tree with the chain applied, not the baseline."),
    full: bool = typer.Option(False, "--full", help="Keep the folders the pin's pack.prune leaves out."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A compact, reproducible archive of the tree, for machines with no network."""
    from polyforge.chain.engine import Chain
    from polyforge.upstream import vendor as vendor_lib
    chain = Chain(find_project())
    info = vendor_lib.pack(chain, out.resolve(), patched=patched, prune=not full)
    if json_out:
        emit_json(info)
    else:
        say(f"[green]ok[/] {info['path']}: {info['bytes'] / 1e6:.1f} MB, tree {info['tree'][:12]}, sha256 {info['sha256']}")
