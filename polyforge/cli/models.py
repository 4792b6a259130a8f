"""polyforge models list|fetch|path"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..project import find_project
from . import app
from .render import emit_json, say

models_app = typer.Typer(help="Models for gates and benchmarks (PyPI packages, sha256-checked, cached).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(json_out: bool = typer.Option(False, "--json")) -> None:
    """The registered models and whether they are cached."""
    from polyforge.models import registry as models_lib
    rows = [models_lib.info(n) for n in models_lib.names()]
    if json_out:
        emit_json(rows)
        return
    for r in rows:
        say(f"{r['name']:<14} {'[green]cached[/]' if r['cached'] else 'not fetched'}  {r['description']}")
    say("[dim]random:SHAPE  a random-weight GGUF (polyforge.models.random_gguf), e.g. random:tiny[/]")


@models_app.command("fetch")
def models_fetch(
    names: List[str] = typer.Argument(..., help="gemma3-270m, or random:SHAPE"),
    find_links: Optional[str] = typer.Option(None, "--find-links", help="A folder with the wheels (no network)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Fetch (or generate) models into the cache; a cache hit costs nothing."""
    from polyforge.models import registry as models_lib
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
    from polyforge.models import registry as models_lib
    info = models_lib.info(name)
    if not info["cached"]:
        say(f"[red]{name} is not fetched[/]: polyforge models fetch {name}")
        raise typer.Exit(1)
    print(info["path"])
