"""Slang source for a narrow float16 network's fused loss and gradient on NVIDIA tensor cores, a warp
per tile of 16 samples (``shaders/nn/warp_mma.slang``), for JAX on CUDA.

The kernel replaces the per-sample ``mlp_loss_grad`` of ``shaders/nn/thread_sums.slang`` where
``KernelLayout.warp_mma`` says so (slax/nn/_kernels.py): the same file writes both, behind the same
declaration: the same operands and scalars, launch and row of partial sums per thread group, so the
primitive runs either alike. The network's other kernels run a sample per thread. What Python
writes is the network's type, :func:`warp_network_aliases`.
"""

from __future__ import annotations

from slax._compile import GROUP_SIZE
from slax.nn._slang_types import chain_aliases

WARP_MMA_WIDTH = 16
"""Widest layer (in or out) the kernel runs: one block of 16 columns."""
WARP_MMA_THREADS_WANTED = 1 << 16
"""THREADS_WANTED (slax/nn/_kernels.py) of this kernel, whose threads hold 64 registers against the
per-sample kernel's 254. Measured on an H100 (4-16-4, float16, 2^20 samples, ``mlp_loss_grad`` alone;
BENCHMARKS.md): 2^16 and 2^17 threads took 21.9-22.2 and 22.2 us; an earlier version of the kernel
(two products per gradient term) took 40.6, 26.7 and 27.8 us at 2^15, 2^16 and 2^17."""


def warp_network_aliases(
    layers: list[tuple[int, int]], offsets: list[int], activations: list[str], row: int, scratch: int
) -> str:
    """The declarations of ``WarpNetwork`` (slax/nn/_slang_types.py, ``chain_aliases``), the
    ``IWarpLayers`` of ``shaders/nn/warp_mma.slang`` that runs ``mlp_loss_grad``
    (``shaders/nn/thread_sums.slang``) for the network whose layers are ``layers`` ((in, out)
    pairs, at most WARP_MMA_WIDTH wide), starting at ``offsets`` in the flat parameter layout, with
    ``activations`` (``IActivation`` types, ``shaders/nn/activations.slang``), writing rows of
    ``row`` partial sums. Each warp leaves its
    sums in a row of the kernel's group-shared ``GroupScratch`` (``scratch`` floats), and the thread
    group adds the warps' rows in order."""
    if GROUP_SIZE // 32 * row > scratch:
        raise ValueError(
            f"slax: {GROUP_SIZE // 32} warps' rows of {row} sums exceed {scratch} scratch floats."
        )
    types = [f"WarpLayer<{i}, {o}, {w}, {a}>" for (i, o), w, a in zip(layers, offsets, activations)]
    return chain_aliases("WarpNetwork", ["WarpChain<"] * (len(types) - 1), types)
