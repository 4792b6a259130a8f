"""Rich output goes to stderr so that stdout stays clean for --json."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

err = Console(stderr=True, highlight=False)


@contextmanager
def download_progress(label: str, total: int | None) -> Iterator:
    """Yields advance(n_bytes); a quiet no-op bar when stderr is not a terminal."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )
    with progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)
