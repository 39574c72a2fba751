"""Run-time switches of slax (``slax.config``)."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class Config:
    """``debug_nans``: check every Slang kernel's floating results and raise
    ``FloatingPointError`` naming the first kernel (and Slang function) that produced a NaN or Inf.
    Off by default: it copies results to the host. Also on when ``SLAX_DEBUG_NANS=1`` or when
    JAX's own ``jax_debug_nans`` is set. Read when a computation is traced.
    """

    debug_nans: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("SLAX_DEBUG_NANS", "") not in ("", "0")
    )


config = Config()
