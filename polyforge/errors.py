"""One exception family; each kind carries the process exit code the CLI returns.

Exit codes: 0 ok, 1 verification failure or drift, 2 usage or bad input, 3 environment
(a missing tool, no network for a source that needs it, a lock held by another run).
"""

from __future__ import annotations


class PolyforgeError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class VerificationFailed(PolyforgeError):
    """The chain, the pin or the lock does not hold (exit 1)."""

    exit_code = 1


class BadInput(PolyforgeError):
    """Bad arguments or bad input files: patches, pins, configuration (exit 2)."""

    exit_code = 2


class EnvironmentProblem(PolyforgeError):
    """Something outside polyforge's inputs is missing or busy (exit 3)."""

    exit_code = 3


class TimedOut(EnvironmentProblem):
    """A command ran past its time limit (proc.run's timeout); callers that treat a hang as a
    failure of what they test, not of the machine, catch this type."""
