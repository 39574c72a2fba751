"""Slang source for the compute kernels that run a Slang function over a call grid.

For a function ``f`` slax writes three entry points, each following the calling convention of
``shaders/slax/kernel.slang`` (uniform pointers for operands, then results, then scalars):

- ``primal``: ``f`` itself; results are the return value then ``out``/``inout`` parameters.
- ``tangent``: ``fwd_diff(f)``; takes primal inputs and tangents of differentiable inputs, writes the
  tangents of differentiable outputs.
- ``cotangent``: ``bwd_diff(f)``; takes primal inputs and cotangents of differentiable outputs,
  writes the cotangents of differentiable inputs over the full grid (JAX sums broadcast axes).

Each thread handles one grid point. Operand ``k`` is read at its row-major offset for that point, its
broadcast axes (compiled into the kernel) left out, times its element size; results are dense over
the grid.

The kernel's own identifiers (:class:`KernelNames`) are named by position under a prefix that no
identifier in the user's sources begins with: parameters called ``result``, or ``x`` beside
``x_t``, or a function called ``count`` cannot clash with them.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable

from slax._signature import SLANG_SCALAR_FOR_DTYPE, Direction, Leaf, Signature, Value


class Mode(enum.Enum):
    PRIMAL = "primal"
    TANGENT = "tangent"
    COTANGENT = "cotangent"


NAME_PREFIX = "slax_"


def name_prefix(taken: Iterable[str]) -> str:
    """The prefix of every identifier a generated kernel declares: ``"slax_"``, or ``"slax1_"``,
    ``"slax2_"``, ... the first that begins none of the identifiers in ``taken`` (those in the
    user's Slang sources), so a generated name can never be, or hide, one the user wrote."""
    taken = tuple(taken)
    for k in itertools.count():
        prefix = NAME_PREFIX if k == 0 else f"{NAME_PREFIX[:-1]}{k}_"
        if not any(name.startswith(prefix) for name in taken):
            return prefix
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class KernelNames:
    """The identifiers of a generated kernel: its entry point, its uniform parameters (which the
    lowering passes by name) and its locals. All begin with ``prefix`` (:func:`name_prefix`) and
    name values by position, never by the user's parameter names."""

    prefix: str = NAME_PREFIX

    def entry(self, signature: Signature, mode: Mode) -> str:
        return f"{self.prefix}{mode.value}_{signature.name}"

    def operand(self, k: int) -> str:
        return f"{self.prefix}in{k}"

    def result(self, k: int) -> str:
        return f"{self.prefix}out{k}"

    @property
    def count(self) -> str:
        return f"{self.prefix}count"

    def grid(self, d: int) -> str:
        return f"{self.prefix}grid{d}"

    def local(self, name: str) -> str:
        return f"{self.prefix}{name}"


def operand_leaves(signature: Signature, mode: Mode) -> list[Leaf]:
    """Leaves of the kernel's operands in order (JAX operands of the matching primitive)."""
    leaves = [leaf for value in signature.inputs for leaf in value.leaves]
    if mode is Mode.TANGENT:
        leaves += differentiable_leaves(signature.inputs)
    elif mode is Mode.COTANGENT:
        leaves += differentiable_leaves(signature.outputs)
    return leaves


def result_leaves(signature: Signature, mode: Mode) -> list[Leaf]:
    """Leaves of the kernel's results in order."""
    if mode is Mode.PRIMAL:
        return [leaf for value in signature.outputs for leaf in value.leaves]
    if mode is Mode.TANGENT:
        return differentiable_leaves(signature.outputs)
    return differentiable_leaves(signature.inputs)


def differentiable_leaves(values: tuple[Value, ...]) -> list[Leaf]:
    return [leaf for value in values if _is_diff(value) for leaf in value.leaves if leaf.differentiable]


def _is_diff(value: Value) -> bool:
    return not value.no_diff and value.differentiable


Broadcast = tuple[tuple[bool, ...], ...]
"""Per kernel operand, per grid axis: is the operand broadcast along it (its size there is 1)?"""


def kernel_source(
    module_path: str,
    signature: Signature,
    mode: Mode,
    broadcast: Broadcast,
    names: KernelNames = KernelNames(),
) -> str:
    """A Slang module with one entry point running ``signature``'s function in ``mode`` over a grid
    of ``len(broadcast[k])`` axes, reading each operand ``k`` as ``broadcast[k]`` says.

    Which axes an operand is broadcast along is compiled in, not passed: the offsets follow from
    the grid's sizes, which are arguments. Entry-point arguments travel as Vulkan push constants
    (256 bytes on lavapipe and NVIDIA), which one stride per operand and axis used to exhaust
    (an 8-argument function differentiated on a 2-D grid)."""
    writer = _KernelWriter(signature, mode, broadcast, names)
    return writer.source(module_path)


def slang_string(text: str) -> str:
    """``text`` as a Slang string literal: a path may hold quotes and backslashes."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _KernelWriter:
    """Writes one entry point. Each value of the signature has a slot named by its position
    (``arg0``, ``arg1``, ..., ``result``), from which its locals are named: ``arg0`` holds the
    primal, ``arg0_t`` its tangent, ``arg0_ct`` its cotangent, ``arg0_pair`` its differential pair."""

    def __init__(self, signature: Signature, mode: Mode, broadcast: Broadcast, names: KernelNames):
        self.sig = signature
        self.mode = mode
        self.operands = operand_leaves(signature, mode)
        if len(broadcast) != len(self.operands) or len({len(b) for b in broadcast}) > 1:
            raise ValueError(
                f"slax: broadcast pattern {broadcast} does not fit {len(self.operands)} operands."
            )
        self.broadcast = broadcast
        self.rank = len(broadcast[0]) if broadcast else 0
        self.names = names
        self.results = result_leaves(signature, mode)
        self.slots = {id(value): f"arg{k}" for k, value in enumerate(signature.params)}
        if signature.result is not None:
            self.slots[id(signature.result)] = "result"
        self.lines: list[str] = []
        self.next_operand = 0
        self.next_result = 0

    def local(self, value: Value, role: str = "") -> str:
        return self.names.local(self.slots[id(value)] + role)

    def source(self, module_path: str) -> str:
        names = self.names
        params = [f"uint3 {names.local('thread')} : SV_DispatchThreadID"]
        params += [f"uniform {_ctype(leaf)}* {names.operand(k)}" for k, leaf in enumerate(self.operands)]
        params += [f"uniform {_ctype(leaf)}* {names.result(k)}" for k, leaf in enumerate(self.results)]
        params += [f"uniform uint {names.count}"]
        params += [f"uniform uint {names.grid(d)}" for d in range(self.rank)]
        self._body()
        body = "\n".join("    " + line for line in self.lines)
        joined = ",\n    ".join(params)
        return (
            f"import {slang_string(module_path)};\nimport slax.kernel;\n\n"
            '[shader("compute")]\n[numthreads(SLAX_GROUP_SIZE, 1, 1)]\n'
            f"void {names.entry(self.sig, self.mode)}(\n    {joined})\n{{\n{body}\n}}\n"
        )

    def _body(self) -> None:
        emit, local = self.lines.append, self.names.local
        index, rest = local("index"), local("rest")
        emit(f"uint {index} = slax_thread_index({local('thread')});")
        emit(f"if ({index} >= {self.names.count}) return;")
        emit(f"uint {rest} = {index};")
        for d in reversed(range(self.rank)):
            grid = self.names.grid(d)
            emit(f"uint {local(f'c{d}')} = {rest} % {grid}; {rest} = {rest} / {grid};")
        for value in self.sig.inputs:
            self._load_value(value, "")
        if self.mode is Mode.PRIMAL:
            self._primal_call()
        elif self.mode is Mode.TANGENT:
            self._tangent_call()
        else:
            self._cotangent_call()

    def _operand_offset(self, k: int) -> str:
        """Operand ``k``'s row-major element index at the thread's grid point: the axes it is
        broadcast along have size 1 in it and contribute nothing."""
        terms: list[str] = []
        sizes: list[str] = []
        for d in reversed(range(self.rank)):
            if self.broadcast[k][d]:
                continue
            terms.append(" * ".join([self.names.local(f"c{d}"), *sizes]))
            sizes.append(self.names.grid(d))
        return " + ".join(terms) if terms else "0"

    def _load_value(self, value: Value, role: str, only_differentiable: bool = False) -> str:
        """Declares a local holding ``value`` (or its differential) read from the next operands."""
        var = self.local(value, role)
        slang_type = value.slang_type + (".Differential" if role and value.is_struct else "")
        self.lines.append(f"{slang_type} {var} = {{}};")
        for leaf in value.leaves:
            if only_differentiable and not leaf.differentiable:
                continue
            k = self.next_operand
            self.next_operand += 1
            offset = self.names.local(f"offset{k}")
            self.lines.append(f"uint {offset} = ({self._operand_offset(k)}) * {leaf.size};")
            for j, suffix in enumerate(leaf.index_suffixes()):
                element = f"{self.names.operand(k)}[{offset} + {j}]"
                self.lines.append(f"{var}{leaf.field_access()}{suffix} = {element};")
        return var

    def _store_value(self, expression: str, value: Value, only_differentiable: bool) -> None:
        index = self.names.local("index")
        for leaf in value.leaves:
            if only_differentiable and not leaf.differentiable:
                continue
            k = self.next_result
            self.next_result += 1
            for j, suffix in enumerate(leaf.index_suffixes()):
                self.lines.append(
                    f"{self.names.result(k)}[{index} * {leaf.size} + {j}] = "
                    f"{expression}{leaf.field_access()}{suffix};"
                )

    def _declare(self, value: Value) -> str:
        """Declares the local that an ``out`` parameter is written to."""
        self.lines.append(f"{value.slang_type} {self.local(value)} = {{}};")
        return self.local(value)

    def _call(self, function: str, args: list[str], result: str) -> None:
        call = f"{function}({', '.join(args)})"
        self.lines.append(f"let {result} = {call};" if self.sig.result is not None else call + ";")

    def _primal_call(self) -> None:
        args = [self._declare(v) if v.direction is Direction.OUT else self.local(v) for v in self.sig.params]
        self._call(self.sig.name, args, self.names.local("result"))
        for value in self.sig.outputs:
            self._store_value(self.local(value), value, only_differentiable=False)

    def _tangent_call(self) -> None:
        """``fwd_diff(f)``: a differential pair for each differentiable parameter (an ``out`` one's
        starts empty), and the tangents of the differentiable outputs read from the pairs."""
        args = []
        for value in self.sig.params:
            if not _is_diff(value):
                args.append(self._declare(value) if value.direction is Direction.OUT else self.local(value))
                continue
            pair = self.local(value, "_pair")
            if value.direction is Direction.OUT:
                self.lines.append(f"var {pair} = diffPair({self._declare(value)});")
            else:
                tangent = self._load_value(value, "_t", only_differentiable=True)
                self.lines.append(f"var {pair} = diffPair({self.local(value)}, {tangent});")
            args.append(pair)
        self._call(f"fwd_diff({self.sig.name})", args, self.names.local("result_pair"))
        for value in self.sig.outputs:
            if _is_diff(value):
                self._store_value(f"{self.local(value, '_pair')}.d", value, only_differentiable=True)

    def _cotangent_call(self) -> None:
        """``bwd_diff(f)``: ``in`` and ``inout`` differentiable parameters become pairs (an ``inout``
        one's holds its output cotangent), a differentiable ``out`` parameter takes its cotangent in
        its place, non-differentiable ``out`` parameters are dropped, and the result's cotangent
        comes last. The pairs then hold the input cotangents."""
        cotangents = {
            id(value): self._load_value(value, "_ct", only_differentiable=True)
            for value in self.sig.outputs
            if _is_diff(value)
        }
        args = []
        pairs = []
        for value in self.sig.params:
            if not _is_diff(value):
                if value.direction is not Direction.OUT:
                    args.append(self.local(value))
            elif value.direction is Direction.OUT:
                args.append(cotangents[id(value)])
            else:
                pair = self.local(value, "_pair")
                given = f", {cotangents[id(value)]}" if value.direction is Direction.INOUT else ""
                self.lines.append(f"var {pair} = diffPair({self.local(value)}{given});")
                args.append(pair)
                pairs.append(value)
        if self.sig.result is not None and id(self.sig.result) in cotangents:
            args.append(cotangents[id(self.sig.result)])
        self.lines.append(f"bwd_diff({self.sig.name})({', '.join(args)});")
        for value in pairs:
            self._store_value(f"{self.local(value, '_pair')}.d", value, only_differentiable=True)


def _ctype(leaf: Leaf) -> str:
    return SLANG_SCALAR_FOR_DTYPE[leaf.dtype]
