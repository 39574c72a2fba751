"""Slang statements that move one thread's leaf between a generated kernel's flat buffer and a
Slang value (:mod:`slax._codegen`), as the widest vectors its address allows.

A thread's leaf of ``n`` scalars lies contiguous in its buffer from scalar ``first``, the thread's
grid offset times ``n``. Moved a scalar at a time, each of a warp's loads or stores is a request of
its own to the L2 cache and fills part of each 32-byte sector: Nsight Compute counted 16 of 32
bytes a sector for the 8 scalar stores with which each thread of the hash encoding's
``encode_jacobian`` wrote its 8 floats. So a leaf of 32-bit scalars (float, int, uint) moves as
``vector<T, 4>``s, then ``vector<T, 2>``s, then scalars, each vector at an address that is a
multiple of its size:

- ``first``'s part is known when the kernel is written: a multiple of 4 or 2 where ``n`` is, and 0
  for an operand broadcast along every grid axis. An odd ``n`` puts odd and even threads' leaves
  at odd and even scalars; those stay scalars, since choosing per thread would split warps.
- The buffer's address is known only at run time: XLA aligns what it allocates, but the calling
  convention promises a kernel only its scalar type's alignment. One test of the pointer per leaf
  (``slax_aligned`` in ``shaders/slax/kernel.slang``, the same in every thread of a launch, so no
  warp splits) chooses between the vectors and the scalars.

The vector moves (``slax_load_vector``, ``slax_store_vector``) are Slang's ``loadAligned`` and
``storeAligned``, which carry the alignment to every target slax compiles for: SPIR-V's
``Aligned`` operand (a plain ``float4`` load through a pointer is ``Aligned 4`` there, which a
driver may split), CUDA's ``float4`` and ``float2``, whose alignment NVRTC turns into
``ld.global.v4.f32`` and ``st.global.v2.f32`` (on both CUDA routes, which compile the same Slang),
and the C++ of SlangPy's CPU device, whose compiler may vectorise as it likes.
"""

from __future__ import annotations

from collections.abc import Callable

from slax._signature import SLANG_SCALAR_FOR_DTYPE, Leaf

WORD_DTYPES = ("float32", "int32", "uint32")
"""The dtypes whose leaves move as vectors: 4 bytes a scalar."""

VECTOR_WIDTHS = (4, 2)
"""The vectors a leaf moves as, widest first."""


def first_step(size: int, first_is_zero: bool) -> int:
    """The largest of :data:`VECTOR_WIDTHS` (or 1) that divides every thread's first scalar: a
    multiple of the leaf's ``size``, or 0 in every thread (``first_is_zero``)."""
    if first_is_zero:
        return VECTOR_WIDTHS[0]
    return next((width for width in VECTOR_WIDTHS if size % width == 0), 1)


def moves(leaf: Leaf, step: int) -> list[tuple[int, int]]:
    """(first scalar, width) of each move of ``leaf``, whose first scalar is a multiple of
    ``step`` scalars past an address aligned for every vector: at each scalar the widest vector
    that fits in the leaf and keeps its own alignment there, a scalar (width 1) where none does,
    and scalars only for a leaf not of :data:`WORD_DTYPES`."""
    if leaf.dtype not in WORD_DTYPES:
        return [(j, 1) for j in range(leaf.size)]
    result, j = [], 0
    while j < leaf.size:
        fits = (w for w in VECTOR_WIDTHS if w <= step and j % w == 0 and j + w <= leaf.size)
        width = next(fits, 1)
        result.append((j, width))
        j += width
    return result


def read(target: str, leaf: Leaf, pointer: str, first: str, step: int, scratch: str) -> list[str]:
    """Statements reading the thread's ``leaf`` into ``target`` (a local of the leaf's type) from
    the uniform pointer ``pointer`` at scalar ``first`` (a multiple of ``step``); the vectors
    read are locals named ``scratch`` and their first scalar's position."""
    suffixes = leaf.index_suffixes()
    scalars = [f"{target}{suffix} = {pointer}[{first} + {j}];" for j, suffix in enumerate(suffixes)]

    def vector(j: int, width: int) -> list[str]:
        local = f"{scratch}{j}"
        load = f"slax_load_vector<{_scalar(leaf)}, {width}>({pointer} + {first} + {j})"
        return [f"let {local} = {load};"] + [
            f"{target}{suffixes[j + i]} = {local}[{i}];" for i in range(width)
        ]

    return _aligned_or_not(leaf, pointer, step, scalars, vector)


def write(source: str, leaf: Leaf, pointer: str, first: str, step: int) -> list[str]:
    """Statements writing ``source`` (an expression of the leaf's type) as the thread's ``leaf``
    through the uniform pointer ``pointer`` at scalar ``first`` (a multiple of ``step``)."""
    suffixes = leaf.index_suffixes()
    scalars = [f"{pointer}[{first} + {j}] = {source}{suffix};" for j, suffix in enumerate(suffixes)]

    def vector(j: int, width: int) -> list[str]:
        parts = ", ".join(f"{source}{suffix}" for suffix in suffixes[j : j + width])
        packed = f"vector<{_scalar(leaf)}, {width}>({parts})"
        return [f"slax_store_vector({pointer} + {first} + {j}, {packed});"]

    return _aligned_or_not(leaf, pointer, step, scalars, vector)


def _aligned_or_not(
    leaf: Leaf,
    pointer: str,
    step: int,
    scalars: list[str],
    vector: Callable[[int, int], list[str]],
) -> list[str]:
    """The statements ``scalars`` (one per scalar), or where the leaf moves as vectors, a branch
    on the pointer's alignment between them and the vector moves (``vector(first, width)``)."""
    planned = moves(leaf, step)
    widest = max((width for _, width in planned), default=1)
    if widest == 1:
        return scalars
    vectors = [line for j, w in planned for line in (vector(j, w) if w > 1 else [scalars[j]])]
    return [
        f"if (slax_aligned({pointer}, {4 * widest}))",
        "{",
        *("    " + line for line in vectors),
        "}",
        "else",
        "{",
        *("    " + line for line in scalars),
        "}",
    ]


def _scalar(leaf: Leaf) -> str:
    return SLANG_SCALAR_FOR_DTYPE[leaf.dtype]
