"""The thin CLI entry: typer parses, a library function does the work, render shows it.

Library modules never import typer. Errors become one line on stderr and the exit code of
their kind (see polyforge.errors).
"""

from __future__ import annotations

import sys

import typer

from ..console import err
from ..errors import PolyforgeError

app = typer.Typer(
    name="polyforge", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Build orchestrator and patch-chain manager for llama.cpp.\n\n"
         "Exit codes: 0 ok, 1 verification failure or drift, 2 usage or bad input, 3 environment.",
)

# each module registers its command group on app; --help lists them in this order
from . import chain, vendor, upstream, build, package, doctor, models, gate, bench, up  # noqa: E402,F401


def main() -> None:
    try:
        app()  # standalone: typer handles its own usage errors (exit 2) and exits
    except PolyforgeError as exc:
        err.print(f"[bold red]error:[/] {_escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint: {_escape(exc.hint)}[/]", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        sys.exit(130)


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)
