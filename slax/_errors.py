"""Exception types that slax raises, so users can catch slax failures by type."""

from __future__ import annotations


class SlangCompileError(RuntimeError):
    """The Slang compiler rejected a module or a generated kernel.

    The message carries the compiler's own diagnostics, with file:line for each error.
    """


class DeviceUnavailableError(RuntimeError):
    """No SlangPy device of the requested kind can be created on this machine."""
