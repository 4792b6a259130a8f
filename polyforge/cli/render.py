"""Shared rendering: JSON to stdout, rich to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..console import err


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def say(message: str) -> None:
    err.print(message, soft_wrap=True)
