"""Slang source for the compute kernels that run a Slang function over a call grid.

For a function ``f`` slax writes up to five entry points, each following the calling convention of
``shaders/slax/kernel.slang`` (uniform pointers for operands, then results, then scalars):

- ``primal``: ``f`` itself; results are the return value then ``out``/``inout`` parameters.
- ``tangent``: ``fwd_diff(f)``; takes primal inputs and tangents of differentiable inputs, writes the
  tangents of differentiable outputs.
- ``cotangent``: ``bwd_diff(f)``; takes primal inputs and cotangents of differentiable outputs,
  writes the cotangents of differentiable inputs over the full grid (JAX sums broadcast axes).
- ``tangent_of_tangent``: ``fwd_diff(fwd_diff(f))``, forward over forward.
- ``tangent_of_cotangent``: the tangent of ``bwd_diff(f)``'s results (forward over reverse), run
  as ``fwd_diff(fwd_diff(f))`` one input component at a time: Slang cannot differentiate what
  ``bwd_diff`` makes.

A tensor parameter (SlangPy's ``ITensor``, ``IDiffTensor``, ``IWTensor``, ``IWDiffTensor``) is built
as slax's concrete type over its operand's pointer (``shaders/slax/tensor.slang``); written tensors,
their tangents and gradient buffers are results updated in place (:class:`ResultSlot`).

Each thread handles one grid point. Operand ``k`` is read at its row-major offset for that point, its
broadcast axes (compiled into the kernel) left out, times its element size; results are dense over
the grid. A thread's leaf of 32-bit scalars moves as ``float4``s and ``float2``s where its address
allows (:mod:`slax._leaf_moves`).

The kernel's own identifiers (:class:`KernelNames`) are named by position under a prefix that no
identifier in the user's sources begins with: parameters called ``result``, or ``x`` beside
``x_t``, or a function called ``count`` cannot clash with them.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Iterable

from slax import _leaf_moves
from slax._signature import FAULT, FLOAT_DTYPES, SLANG_SCALAR_FOR_DTYPE, Direction, Leaf, Signature, Value


class Mode(enum.Enum):
    PRIMAL = "primal"
    TANGENT = "tangent"
    COTANGENT = "cotangent"
    TANGENT_OF_TANGENT = "tangent_of_tangent"
    """``fwd_diff(fwd_diff(f))``: forward over forward (``jax.jacfwd(jax.jacfwd(f))``)."""
    TANGENT_OF_COTANGENT = "tangent_of_cotangent"
    """The tangent of ``bwd_diff(f)``: forward over reverse (``jax.hessian``, ``jax.jvp`` of
    ``jax.grad``), which the kernel runs as ``bwd_diff(fwd_diff(f))``."""


NAME_PREFIX = "slax_"

_NULL = "(uint*)0"
"""A null fault record: a kernel that records nothing."""


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
    """Leaves of the kernel's operands in order (JAX operands of the matching primitive): the
    primal inputs' (a written tensor's is the zeroed array it is written into), then per mode
    (``dx`` the differentiable inputs' leaves, ``dy`` the outputs') ``tangent``: ``dx``;
    ``cotangent``: ``dy`` and a zeroed gradient buffer per differentiable input tensor, which its
    loads' backward adds into; ``tangent_of_tangent``: ``dx`` (the inner tangent), ``dx`` (the outer
    tangent of the primal), ``dx`` (the outer tangent of the inner tangent);
    ``tangent_of_cotangent``: ``dy`` (the cotangent), ``dx`` (the primal's tangent), ``dy`` (the
    cotangent's tangent). A differentiable input tensor's tangent is a whole array of its shape; a
    differentiable written tensor's tangent is written into its zeroed operand (:func:`result_slots`).
    Last, a zeroed fault record (:data:`FAULT`) where the kernel keeps one (:func:`keeps_fault_record`).
    Second derivatives of functions with tensor parameters are refused before a kernel is written."""
    leaves = [leaf for value in signature.inputs for leaf in value.leaves]
    dx = differentiable_leaves(signature.inputs, input_differentiable)
    dy = differentiable_leaves(signature.outputs, output_differentiable)
    buffers = [value.leaves[0] for value in signature.inputs if _diff_tensor(value, written=False)]
    extra = {
        Mode.PRIMAL: [],
        Mode.TANGENT: dx,
        Mode.COTANGENT: dy + buffers,
        Mode.TANGENT_OF_TANGENT: dx + dx + dx,
        Mode.TANGENT_OF_COTANGENT: dy + dx + dy,
    }
    leaves += extra[mode]
    if keeps_fault_record(signature, mode):  # the zeroed fault record, updated in place
        leaves.append(FAULT)
    return leaves


def _checks_bounds(signature: Signature, mode: Mode) -> bool:
    return signature.bounds_checked and mode is Mode.PRIMAL


def _checks_tangents(signature: Signature, mode: Mode) -> bool:
    """Does a forward-mode kernel record a load or store that dropped its tangent (SlangPy's
    rank-specific index forms, ``shaders/slax/tensor.slang``)?"""
    return mode is Mode.TANGENT and any(
        _diff_tensor(value, written=False) or _diff_tensor(value, written=True) for value in signature.params
    )


def keeps_fault_record(signature: Signature, mode: Mode) -> bool:
    """Does the kernel take a fault record (its last operand, updated in place): a bounds-checked
    primal kernel's first index outside a tensor, or a forward-mode kernel's first load or store
    that dropped its tangent?"""
    return _checks_bounds(signature, mode) or _checks_tangents(signature, mode)


@dataclasses.dataclass(frozen=True)
class ResultSlot:
    """A kernel result: its leaf, and where its shape comes from. By default it is dense over the
    grid (``grid + leaf.shape``); ``like_operand`` shapes it as that operand (a tensor's result);
    ``aliased`` makes it that operand's buffer, updated in place through the operand's pointer (a
    written tensor, a gradient buffer); a ``scratch`` result (``leaf.shape``) is where a written
    tensor's stores go while ``fwd_diff`` or ``bwd_diff`` replays the function, and is dropped."""

    leaf: Leaf
    like_operand: int | None = None
    aliased: bool = False
    scratch: bool = False


def result_slots(signature: Signature, mode: Mode) -> list[ResultSlot]:
    """The kernel's results in order: the outputs (``PRIMAL``), the tangents of the differentiable
    outputs (``TANGENT``, and their second tangents in ``TANGENT_OF_TANGENT``) or the cotangents of
    the differentiable inputs (``COTANGENT``; their tangents in ``TANGENT_OF_COTANGENT``). A
    written tensor's tangent is its zeroed operand, updated in place; ``TANGENT`` and ``COTANGENT``
    add a scratch result per written tensor, and the fault record last where the kernel keeps one."""
    position = {id(value): k for k, value in enumerate(signature.inputs)}  # tensors have one leaf
    first = [sum(len(v.leaves) for v in signature.inputs[:k]) for k in range(len(signature.inputs))]

    def operand(value: Value) -> int:
        return first[position[id(value)]]

    scratch = [
        ResultSlot(dataclasses.replace(value.leaves[0], shape=value.tensor.element), scratch=True)
        for value in signature.inputs
        if value.tensor is not None and value.tensor.written
    ]
    fault = []
    if keeps_fault_record(signature, mode):
        fault = [ResultSlot(FAULT, len(operand_leaves(signature, mode)) - 1, aliased=True)]
    if mode is Mode.PRIMAL:
        slots = [
            ResultSlot(leaf, operand(value), aliased=True) if value.tensor else ResultSlot(leaf)
            for value in signature.outputs
            for leaf in value.leaves
        ]
        return slots + fault
    if mode is Mode.TANGENT_OF_TANGENT:
        return [ResultSlot(leaf) for leaf in differentiable_leaves(signature.outputs, output_differentiable)]
    if mode is Mode.TANGENT_OF_COTANGENT:
        return [ResultSlot(leaf) for leaf in differentiable_leaves(signature.inputs, input_differentiable)]
    if mode is Mode.TANGENT:
        slots = [
            ResultSlot(leaf, operand(value), aliased=True) if value.tensor else ResultSlot(leaf)
            for value in signature.outputs
            if output_differentiable(value)
            for leaf in value.leaves
            if leaf.differentiable
        ]
        return slots + scratch + fault
    accumulator = len(operand_leaves(signature, mode)) - sum(
        _diff_tensor(v, written=False) for v in signature.inputs
    )
    slots = []
    for value in signature.inputs:
        if not input_differentiable(value):
            continue
        if value.tensor:
            slots.append(ResultSlot(value.leaves[0], accumulator, aliased=True))
            accumulator += 1
        else:
            slots += [ResultSlot(leaf) for leaf in value.leaves if leaf.differentiable]
    return slots + scratch


def result_leaves(signature: Signature, mode: Mode) -> list[Leaf]:
    """Leaves of the kernel's results in order."""
    return [slot.leaf for slot in result_slots(signature, mode)]


def differentiable_leaves(values: tuple[Value, ...], takes_part: Callable[[Value], bool]) -> list[Leaf]:
    """The differentiable leaves of the ``values`` that take part in differentiation
    (:func:`input_differentiable` or :func:`output_differentiable`)."""
    return [leaf for value in values if takes_part(value) for leaf in value.leaves if leaf.differentiable]


def _is_diff(value: Value) -> bool:
    """A value (not a tensor) that has a differential of its own: a pair in ``fwd_diff``/``bwd_diff``."""
    return value.tensor is None and not value.no_diff and value.differentiable


def _diff_tensor(value: Value, *, written: bool) -> bool:
    tensor = value.tensor
    return tensor is not None and tensor.written == written and not value.no_diff and value.differentiable


def input_differentiable(value: Value) -> bool:
    """Does an input take part in differentiation (a tangent operand, a cotangent result)? A written
    tensor does not: its input is the zeroed array the call writes into."""
    return _is_diff(value) or _diff_tensor(value, written=False)


def output_differentiable(value: Value) -> bool:
    """Does an output take part in differentiation (a tangent result, a cotangent operand)?"""
    return _is_diff(value) or _diff_tensor(value, written=True)


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
    primal, ``arg0_t`` its tangent, ``arg0_ct`` its cotangent, ``arg0_pair`` its differential pair.

    Locals are declared without an initializer (``T x;``, then written field by field): ``T x = {}``
    calls a default constructor, which a struct with an ``__init`` of its own does not have.

    A struct's differential is Slang's ``T.Differential``, whose members need not be the struct's
    fields (``typedef B Differential`` with ``[DerivativeMember(B.z)]``), while JAX's tangent of a
    struct is a dict of its fields. The two are converted by differentiating two helpers the kernel
    declares per struct value: ``build`` (the fields' leaves to the struct) and ``split`` (the
    struct to its leaves). ``fwd_diff(build)`` makes an input's tangent, ``fwd_diff(split)`` reads
    an output's; ``bwd_diff(split)`` makes an output's cotangent, ``bwd_diff(build)`` reads an
    input's. Slang maps each field to its ``Differential`` member as it does anywhere else."""

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
        self.result_slots = result_slots(signature, mode)
        # A result updated in place through its operand's pointer has no pointer of its own.
        self.results = [slot.leaf for slot in self.result_slots if not slot.aliased]
        self.slots = {id(value): f"arg{k}" for k, value in enumerate(signature.params)}
        if signature.result is not None:
            self.slots[id(signature.result)] = "result"
        self.lines: list[str] = []
        self.helpers: dict[str, str] = {}
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
        helpers = "".join(helper + "\n" for helper in self.helpers.values())
        tensors = "import slax.tensor;\nimport slangpy;\n" if any(v.tensor for v in self.sig.params) else ""
        return (
            f"import {slang_string(module_path)};\nimport slax.kernel;\n{tensors}\n{helpers}"
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
        record = _NULL
        if keeps_fault_record(self.sig, self.mode):
            k = len(self.operands) - 1
            record = f"{self.names.operand(k)} + ({self._operand_offset(k)}) * {FAULT.size}"
        self.fault = record if _checks_bounds(self.sig, self.mode) else _NULL
        self.dropped_tangent = record if _checks_tangents(self.sig, self.mode) else _NULL
        first_scratch = sum(not slot.aliased and not slot.scratch for slot in self.result_slots)
        self.scratch_results = itertools.count(first_scratch)
        self.tensor_ids = {id(v): k for k, v in enumerate(v for v in self.sig.params if v.tensor)}
        for value in self.sig.inputs:
            self._load_value(value)
        calls = {
            Mode.PRIMAL: self._primal_call,
            Mode.TANGENT: self._tangent_call,
            Mode.COTANGENT: self._cotangent_call,
            Mode.TANGENT_OF_TANGENT: self._tangent_of_tangent_call,
            Mode.TANGENT_OF_COTANGENT: self._tangent_of_cotangent_call,
        }
        calls[self.mode]()

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

    # --- moving leaves between the kernel's arrays and Slang values -------------------------------

    def _read_leaf(self, target: str, leaf: Leaf) -> None:
        """Reads the next operand at the thread's grid point into ``target``, of ``leaf``'s type, as
        vectors where it can (:mod:`slax._leaf_moves`)."""
        k = self.next_operand
        self.next_operand += 1
        offset = self.names.local(f"offset{k}")
        grid_offset = self._operand_offset(k)
        self.lines.append(f"uint {offset} = ({grid_offset}) * {leaf.size};")
        step = _leaf_moves.first_step(leaf.size, first_is_zero=grid_offset == "0")
        scratch = self.names.local(f"in{k}_")
        self.lines += _leaf_moves.read(target, leaf, self.names.operand(k), offset, step, scratch)

    def _write_leaf(self, source: str, leaf: Leaf) -> None:
        """Writes ``source``, of ``leaf``'s type, to the next result at the thread's grid point, as
        vectors where it can (:mod:`slax._leaf_moves`)."""
        k = self.next_result
        self.next_result += 1
        first = f"{self.names.local('index')} * {leaf.size}"
        step = _leaf_moves.first_step(leaf.size, first_is_zero=False)
        self.lines += _leaf_moves.write(source, leaf, self.names.result(k), first, step)

    def _declare(self, value: Value, role: str = "") -> str:
        """Declares a local of ``value``'s type, without an initializer (see the class); a tensor's
        is the concrete type the kernel builds over its pointers."""
        var = self.local(value, role)
        tensor = value.tensor
        kind = value.slang_type
        if tensor is not None:
            kind = f"{tensor.kernel_type}<{value.leaves[0].slang_type}, {tensor.rank}>"
        self.lines.append(f"{kind} {var};")
        return var

    # --- tensors ----------------------------------------------------------------------------------

    def _load_tensor(self, value: Value) -> None:
        """Builds a tensor parameter's value over its operand (at the thread's grid point: a tensor
        vmapped over a grid axis is one tensor per index of it). In ``fwd_diff`` and ``bwd_diff``,
        which replay the function's stores, a written tensor's primal is a scratch result instead,
        and in ``fwd_diff`` a differentiable one's tangent is its operand (:func:`result_slots`).
        An input tensor's tangent is bound where ``fwd_diff`` reads tangents (``_tangent_call``)."""
        var = self._declare(value)
        assert value.tensor is not None
        if value.tensor.kernel_type != "SlaxTensor":  # where forward mode records a dropped tangent
            tracked = _diff_tensor(value, written=value.tensor.written)
            self.lines.append(f"{var}._dropped_tangent = {self.dropped_tangent if tracked else _NULL};")
        pointer = self._next_operand_pointer(value.leaves[0])
        if self.mode is Mode.PRIMAL or not value.tensor.written:
            self._bind_tensor(var + _primal_field(value), value, pointer)
            return
        scratch = self.names.result(next(self.scratch_results))
        self._bind_tensor(var + _primal_field(value), value, scratch, scratch=True)
        if self.mode is Mode.TANGENT and output_differentiable(value):
            self._bind_tensor(var + "._tangent", value, pointer)

    def _next_operand_pointer(self, leaf: Leaf) -> str:
        k = self.next_operand
        self.next_operand += 1
        return f"{self.names.operand(k)} + ({self._operand_offset(k)}) * {leaf.size}"

    def _bind_tensor(self, target: str, value: Value, pointer: str, scratch: bool = False) -> None:
        """Points the dense tensor ``target`` (a ``SlaxTensor``) at ``pointer``, with the tensor's
        shape and row-major strides compiled in; a scratch tensor's strides are all 0 (every store
        lands on its one element)."""
        assert value.tensor is not None
        leaf, rank = value.leaves[0], value.tensor.rank
        shape = leaf.shape[:rank]
        strides = [0 if scratch else math.prod(shape[d + 1 :]) for d in range(rank)]
        self.lines += [
            f"{target}._fault = {_NULL if scratch else self.fault};",
            f"{target}._id = {self.tensor_ids[id(value)]};",
            f"{target}._data = ({leaf.slang_type}*)({pointer});",
            f"{target}._shape = {{{', '.join(str(n) for n in shape)}}};",
            f"{target}._strides = {{{', '.join(str(n) for n in strides)}}};",
            f"{target}._offset = 0;",
        ]

    def _load_value(self, value: Value) -> None:
        if value.tensor is not None:
            self._load_tensor(value)
            return
        var = self._declare(value)
        for leaf in value.leaves:
            self._read_leaf(var + leaf.field_access(), leaf)

    def _store_value(self, value: Value) -> None:
        if value.tensor is not None:
            return  # written in place
        for leaf in value.leaves:
            self._write_leaf(self.local(value) + leaf.field_access(), leaf)

    def _zero(self, value: Value, role: str) -> str:
        """A local of ``value``'s type with every field zero: the primal at which a cotangent is
        mapped (``split`` is linear, so any primal gives the same map; this one is defined)."""
        var = self._declare(value, role + "_zero")
        for leaf in value.leaves:
            self.lines += [f"{var}{leaf.field_access()}{suffix} = 0;" for suffix in leaf.index_suffixes()]
        return var

    def _load_differential(self, value: Value, role: str, tangent: bool) -> str:
        """Declares a local (named by ``role``) holding an input's tangent (``tangent``) or an
        output's cotangent, read from the next operands (one per differentiable leaf)."""
        if not value.is_struct:
            var = self._declare(value, role)
            self._read_leaf(var, value.leaves[0])
            return var
        given: dict[int, str] = {}
        for k, leaf in enumerate(value.leaves):
            if leaf.differentiable:
                given[k] = self.local(value, f"{role}{k}")
                self.lines.append(f"{leaf.slang_type} {given[k]};")
                self._read_leaf(given[k], leaf)
        var = self.local(value, role)
        if tangent:
            return self._tangent_of_leaves(value, given, var)
        pair = self.local(value, role + "pair")
        primal = self.local(value) if value.direction is Direction.INOUT else self._zero(value, role)
        self.lines.append(f"var {pair} = diffPair({primal});")
        self.lines.append(f"bwd_diff({self._split(value)})({', '.join([pair, *given.values()])});")
        self.lines.append(f"let {var} = {pair}.d;")
        return var

    def _tangent_of_leaves(self, value: Value, given: dict[int, str], var: str) -> str:
        """Declares ``var``, the struct ``value``'s ``Differential`` whose differentiable leaves
        (by index) are the locals ``given``, through ``fwd_diff(build)`` (see the class)."""
        fields = [self.local(value) + leaf.field_access() for leaf in value.leaves]
        args = [f"diffPair({field}, {given[k]})" if k in given else field for k, field in enumerate(fields)]
        self.lines.append(f"let {var} = fwd_diff({self._build(value)})({', '.join(args)}).d;")
        return var

    def _store_differential(self, value: Value, pair: str, tangent: bool) -> None:
        """Writes the differential in ``pair`` (a ``DifferentialPair`` of ``value``'s type) to the
        next results, one per differentiable leaf: an output's tangent (``tangent``) or an input's
        cotangent."""
        for expression, leaf in self._differential_leaves(value, pair, tangent, "_d"):
            self._write_leaf(expression, leaf)

    def _differential_leaves(
        self, value: Value, pair: str, tangent: bool, role: str
    ) -> list[tuple[str, Leaf]]:
        """The differentiable leaves of the differential in ``pair``, as expressions of locals
        named by ``role``: through ``fwd_diff(split)`` for a tangent, ``bwd_diff(build)`` for a
        cotangent (see the class)."""
        if not value.is_struct:
            return [(f"{pair}.d", value.leaves[0])]
        args, written = [], []
        for k, leaf in enumerate(value.leaves):
            var = self.local(value, f"{role}{k}")
            if tangent:
                kind = f"DifferentialPair<{leaf.slang_type}>" if leaf.differentiable else leaf.slang_type
                self.lines.append(f"{kind} {var};")
            elif leaf.differentiable:
                self.lines.append(f"var {var} = diffPair({self.local(value)}{leaf.field_access()});")
            else:
                var = self.local(value) + leaf.field_access()
            args.append(var)
            if leaf.differentiable:
                written.append((f"{var}.d", leaf))
        if tangent:
            self.lines.append(f"fwd_diff({self._split(value)})({', '.join([pair, *args])});")
        else:
            self.lines.append(f"bwd_diff({self._build(value)})({', '.join([*args, f'{pair}.d'])});")
        return written

    def _build(self, value: Value) -> str:
        """``T build(leaf0, leaf1, ...)``: ``value``'s struct from its leaves."""
        name = self.local(value, "_build")
        leaves = [self.names.local(f"leaf{k}") for k in range(len(value.leaves))]
        struct = self.names.local("value")
        params = ", ".join(f"{_no_diff(leaf)}{leaf.slang_type} {v}" for leaf, v in zip(value.leaves, leaves))
        body = "".join(f"    {struct}{leaf.field_access()} = {v};\n" for leaf, v in zip(value.leaves, leaves))
        self.helpers[name] = (
            f"[Differentiable]\n{value.slang_type} {name}({params})\n{{\n"
            f"    {value.slang_type} {struct};\n{body}    return {struct};\n}}\n"
        )
        return name

    def _split(self, value: Value) -> str:
        """``void split(T value, out leaf0, out leaf1, ...)``: ``value``'s struct to its leaves."""
        name = self.local(value, "_split")
        leaves = [self.names.local(f"leaf{k}") for k in range(len(value.leaves))]
        struct = self.names.local("value")
        params = [f"{value.slang_type} {struct}"]
        params += [f"{_no_diff(leaf)}out {leaf.slang_type} {v}" for leaf, v in zip(value.leaves, leaves)]
        body = "".join(
            f"    {v} = {_detach(leaf, struct + leaf.field_access())};\n"
            for leaf, v in zip(value.leaves, leaves)
        )
        self.helpers[name] = f"[Differentiable]\nvoid {name}({', '.join(params)})\n{{\n{body}}}\n"
        return name

    # --- the calls --------------------------------------------------------------------------------

    def _call(self, function: str, args: list[str], result: str) -> None:
        call = f"{function}({', '.join(args)})"
        self.lines.append(f"let {result} = {call};" if self.sig.result is not None else call + ";")

    def _primal_call(self) -> None:
        args = [self._declare(v) if v.direction is Direction.OUT else self.local(v) for v in self.sig.params]
        self._call(self.sig.name, args, self.local(self.sig.result) if self.sig.result else "")
        for value in self.sig.outputs:
            self._store_value(value)

    def _forward_arguments(self, pair_of: Callable[[Value], str], order: int) -> list[str]:
        """The arguments of ``fwd_diff`` nested ``order`` times, in the parameters' order: a pair
        ``{name}_pair`` for each differentiable parameter, an input's ``pair_of(value)`` (which may
        declare locals first), an ``out`` one's empty; the others as they are (an ``out`` one
        declared)."""
        args = []
        for value in self.sig.params:
            if not _is_diff(value):
                args.append(self._declare(value) if value.direction is Direction.OUT else self.local(value))
                continue
            pair = self.local(value, "_pair")
            if value.direction is Direction.OUT:
                self.lines.append(f"var {pair} = {'diffPair(' * order}{self._declare(value)}{')' * order};")
            else:
                self.lines.append(f"var {pair} = {pair_of(value)};")
            args.append(pair)
        return args

    def _tangent_call(self) -> None:
        """``fwd_diff(f)``: a differential pair for each differentiable parameter (an ``out`` one's
        starts empty), and the tangents of the differentiable outputs read from the pairs. An input
        tensor's tangent is bound where its loads' forward derivative reads it."""
        tangents = {}
        for value in self.sig.inputs:
            if _diff_tensor(value, written=False):
                pointer = self._next_operand_pointer(value.leaves[0])
                self._bind_tensor(self.local(value) + "._tangent", value, pointer)
            elif _is_diff(value):
                tangents[id(value)] = self._load_differential(value, "_t", tangent=True)
        args = self._forward_arguments(lambda v: f"diffPair({self.local(v)}, {tangents[id(v)]})", order=1)
        self._call(f"fwd_diff({self.sig.name})", args, self.names.local("result_pair"))
        for value in self.sig.outputs:
            if _is_diff(value):
                self._store_differential(value, self.local(value, "_pair"), tangent=True)

    def _cotangent_call(self) -> None:
        """``bwd_diff(f)``: ``in`` and ``inout`` differentiable parameters become pairs (an ``inout``
        one's holds its output cotangent), a differentiable ``out`` parameter takes its cotangent in
        its place, non-differentiable ``out`` parameters are dropped, and the result's cotangent
        comes last. The pairs then hold the input cotangents."""
        cotangents = {}
        for value in self.sig.outputs:
            if _is_diff(value):
                cotangents[id(value)] = self._load_differential(value, "_ct", tangent=False)
            elif output_differentiable(value):  # a written tensor's stores read its cotangent
                pointer = self._next_operand_pointer(value.leaves[0])
                self._bind_tensor(self.local(value) + "._grad_in", value, pointer)
        for value in self.sig.inputs:
            if _diff_tensor(value, written=False):  # its loads' backward adds into the zeroed buffer
                pointer = self._next_operand_pointer(value.leaves[0])
                self._bind_tensor(self.local(value) + "._grad_out._tensor", value, pointer)
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
            self._store_differential(value, self.local(value, "_pair"), tangent=False)

    def _tangent_of_tangent_call(self) -> None:
        """``fwd_diff(fwd_diff(f))``: each differentiable parameter a pair of pairs, the primal
        with its inner tangent and their outer tangents (an ``out`` one's starts empty); the
        outputs' second tangents (``.d.d``) are written."""
        inputs = [v for v in self.sig.inputs if _is_diff(v)]
        loaded = {
            role: {id(v): self._load_differential(v, role, tangent=True) for v in inputs}
            for role in ("_t", "_e", "_et")
        }

        def pair_of(value: Value) -> str:
            t, e, et = (loaded[role][id(value)] for role in ("_t", "_e", "_et"))
            return f"diffPair(diffPair({self.local(value)}, {t}), diffPair({e}, {et}))"

        args = self._forward_arguments(pair_of, order=2)
        self._call(f"fwd_diff(fwd_diff({self.sig.name}))", args, self.names.local("result_pair"))
        for value in self.sig.outputs:
            if _is_diff(value):
                pair, second = self.local(value, "_pair"), self.local(value, "_second")
                self.lines.append(f"var {second} = diffPair({pair}.p.p, {pair}.d.d);")
                self._store_differential(value, second, tangent=True)

    def _tangent_of_cotangent_call(self) -> None:
        """The tangent ``H(ct) dx + J^T dct`` of ``bwd_diff(f)``'s input cotangents ``J^T ct``
        (``H(ct)`` the Hessian of ``ct . f``, ``J`` the Jacobian), one input component ``e_k`` at
        a time: ``fwd_diff(fwd_diff(f))`` along the inner tangent ``dx`` and the outer tangent
        ``e_k`` gives ``f''[dx, e_k]`` (``.d.d``) and ``f'[e_k]`` (``.d.p``), whose products with
        ``ct`` and ``dct`` are component ``k``. Slang 2026.12 cannot differentiate what
        ``bwd_diff`` makes, and its ``bwd_diff(fwd_diff(f))`` fails on ``out`` and ``inout``
        parameters, which nested ``fwd_diff`` takes (``out``) or refuses plainly (``inout``,
        refused before any kernel is written).
        Components are accumulated in float: half's products would round at every term."""
        emit, local = self.lines.append, self.names.local
        outputs = [v for v in self.sig.outputs if _is_diff(v)]
        inputs = [v for v in self.sig.inputs if _is_diff(v)]
        cotangents = {id(v): self._load_leaves(v, "_ct") for v in outputs}
        tangents = {id(v): self._load_differential(v, "_t", tangent=True) for v in inputs}
        cotangent_tangents = {id(v): self._load_leaves(v, "_dct") for v in outputs}
        components = [
            (value, k, suffix)
            for value in inputs
            for k, leaf in enumerate(value.leaves)
            if leaf.differentiable
            for suffix in leaf.index_suffixes()
        ]
        sums = {}
        for value in inputs:
            for k, leaf in enumerate(value.leaves):
                if leaf.differentiable:
                    sums[id(value), k] = self.local(value, f"_sum{k}")
                    emit(f"{leaf.slang_type} {sums[id(value), k]};")
        component, total = local("component"), local("total")
        emit(f"for (uint {component} = 0; {component} < {len(components)}; {component}++)")
        emit("{")
        start = len(self.lines)
        numbering = iter(range(len(components)))

        def pair_of(value: Value) -> str:
            """The pair along the input component the loop is at: ``e_k``, one 1 among 0s."""
            given = {}
            for k, leaf in enumerate(value.leaves):
                if leaf.differentiable:
                    given[k] = self.local(value, f"_e{k}")
                    emit(f"{leaf.slang_type} {given[k]};")
                    for suffix in leaf.index_suffixes():
                        one = f"{component} == {next(numbering)} ? 1.0 : 0.0"
                        emit(f"{given[k]}{suffix} = {_ctype(leaf)}({one});")
            direction = (
                given[0]
                if not value.is_struct
                else self._tangent_of_leaves(value, given, self.local(value, "_e"))
            )
            return f"diffPair(diffPair({self.local(value)}, {tangents[id(value)]}), diffPair({direction}))"

        args = self._forward_arguments(pair_of, order=2)
        self._call(f"fwd_diff(fwd_diff({self.sig.name}))", args, self.names.local("result_pair"))
        emit(f"float {total} = 0.0;")
        for value in outputs:
            pair = self.local(value, "_pair")
            second, first = self.local(value, "_second"), self.local(value, "_first")
            emit(f"var {second} = diffPair({pair}.p.p, {pair}.d.d);")
            emit(f"var {first} = diffPair({pair}.p.p, {pair}.d.p);")
            seconds = self._differential_leaves(value, second, tangent=True, role="_dd")
            firsts = self._differential_leaves(value, first, tangent=True, role="_dp")
            weights = zip(cotangents[id(value)], cotangent_tangents[id(value)], seconds, firsts)
            for (ct, leaf), (dct, _), (dd, _), (dp, _) in weights:
                for suffix in leaf.index_suffixes():
                    emit(
                        f"{total} += float({ct}{suffix}) * float({dd}{suffix}) "
                        f"+ float({dct}{suffix}) * float({dp}{suffix});"
                    )
        for index, (value, k, suffix) in enumerate(components):
            leaf = value.leaves[k]
            emit(f"if ({component} == {index}) {sums[id(value), k]}{suffix} = {_ctype(leaf)}({total});")
        self.lines[start:] = ["    " + line for line in self.lines[start:]]
        emit("}")
        for value in inputs:
            for k, leaf in enumerate(value.leaves):
                if leaf.differentiable:
                    self._write_leaf(sums[id(value), k], leaf)

    def _load_leaves(self, value: Value, role: str) -> list[tuple[str, Leaf]]:
        """Declares a local per differentiable leaf of ``value`` (named by ``role``), read from the
        next operands."""
        loaded = []
        for k, leaf in enumerate(value.leaves):
            if leaf.differentiable:
                var = self.local(value, f"{role}{k}")
                self.lines.append(f"{leaf.slang_type} {var};")
                self._read_leaf(var, leaf)
                loaded.append((var, leaf))
        return loaded


def _primal_field(value: Value) -> str:
    """Where a tensor's values are in its kernel type: a ``SlaxTensor`` holds them itself."""
    assert value.tensor is not None
    return "" if value.tensor.kernel_type == "SlaxTensor" else "._primal"


def _detach(leaf: Leaf, expression: str) -> str:
    """``expression`` as a ``no_diff`` floating leaf is written: detached, as Slang asks."""
    return f"detach({expression})" if _no_diff(leaf) else expression


def _no_diff(leaf: Leaf) -> str:
    """``no_diff`` before a helper's parameter for a floating leaf Slang must not differentiate."""
    return "no_diff " if leaf.dtype in FLOAT_DTYPES and not leaf.differentiable else ""


def _ctype(leaf: Leaf) -> str:
    return SLANG_SCALAR_FOR_DTYPE[leaf.dtype]
