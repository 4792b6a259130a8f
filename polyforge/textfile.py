"""Reading and writing the project's own text inputs (pin.yaml, chain.lock): every OS or decoding
failure becomes one error line of the right kind (2 for a path that is not a file, 3 for I/O)."""

from __future__ import annotations

from pathlib import Path

from .errors import BadInput, EnvironmentProblem


def read_text(path: Path) -> str:
    """The file's UTF-8 text; FileNotFoundError is left to the caller, who knows what missing means."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise BadInput(f"{path}: is a folder, not a file") from None
    except NotADirectoryError:
        raise BadInput(f"{path}: a parent is not a folder") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot read ({exc.strerror or exc})") from None


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        if tmp.is_file():
            tmp.unlink()
        if isinstance(exc, NotADirectoryError):
            raise BadInput(f"cannot write {path}: a parent is not a folder") from None
        if isinstance(exc, IsADirectoryError):
            raise BadInput(f"cannot write {path}: it is a folder") from None
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}") from None
