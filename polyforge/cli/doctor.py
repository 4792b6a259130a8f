"""polyforge doctor"""

from __future__ import annotations

import typer
from rich.table import Table

from ..console import err
from . import app
from .render import emit_json


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json")) -> None:
    """Python, cmake, ninja, compilers, nvcc, GPU, ccache, free disk: each ok or missing, with the fix."""
    from polyforge.build import doctor as doctor_lib
    report = doctor_lib.diagnose()
    if json_out:
        emit_json(report.as_dict())
    else:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("check", "state", "detail", "fix"):
            table.add_column(col)
        for c in report.checks:
            state = "[green]ok[/]" if c.ok else ("[red]missing[/]" if c.required else "[yellow]missing[/]")
            table.add_row(c.name, state, c.detail, c.fix or "")
        err.print(table)
    raise typer.Exit(0 if report.ok else 3)
