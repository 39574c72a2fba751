"""Slang source for the compute kernels that run a Slang function over a call grid.

For a function ``f`` slax writes three entry points, each following the calling convention of
``shaders/slax/kernel.slang`` (uniform pointers for operands, then results, then scalars):

- ``primal``: ``f`` itself; results are the return value then ``out``/``inout`` parameters.
- ``tangent``: ``fwd_diff(f)``; takes primal inputs and tangents of differentiable inputs, writes the
  tangents of differentiable outputs.
- ``cotangent``: ``bwd_diff(f)``; takes primal inputs and cotangents of differentiable outputs,
  writes the cotangents of differentiable inputs over the full grid (JAX sums broadcast axes).

Each thread handles one grid point. Operand ``k`` is read at grid offset ``sum_d c_d * stride_k_d``
(stride 0 on broadcast axes) times its element size; results are dense over the grid.
"""

from __future__ import annotations

import enum

from slax._signature import SLANG_SCALAR_FOR_DTYPE, Direction, Leaf, Signature, Value

GROUP_SIZE = 64
"""Threads per group: SLAX_GROUP_SIZE in shaders/slax/kernel.slang (tests/test_codegen.py pins both)."""
ROW_THREADS = 64 * 32768
"""Threads per dispatch row: SLAX_ROW_THREADS in shaders/slax/kernel.slang."""


class Mode(enum.Enum):
    PRIMAL = "primal"
    TANGENT = "tangent"
    COTANGENT = "cotangent"


def entry_point_name(signature: Signature, mode: Mode) -> str:
    return f"slax_{mode.value}_{signature.name}"


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


def kernel_source(module_path: str, signature: Signature, mode: Mode, grid_rank: int) -> str:
    """A Slang module with one entry point running ``signature``'s function in ``mode``."""
    writer = _KernelWriter(signature, mode, grid_rank)
    return writer.source(module_path)


class _KernelWriter:
    def __init__(self, signature: Signature, mode: Mode, grid_rank: int):
        self.sig = signature
        self.mode = mode
        self.rank = grid_rank
        self.operands = operand_leaves(signature, mode)
        self.results = result_leaves(signature, mode)
        self.lines: list[str] = []
        self.next_operand = 0
        self.next_result = 0

    def source(self, module_path: str) -> str:
        params = ["uint3 thread_id : SV_DispatchThreadID"]
        params += [f"uniform {_ctype(leaf)}* in_{k}" for k, leaf in enumerate(self.operands)]
        params += [f"uniform {_ctype(leaf)}* out_{k}" for k, leaf in enumerate(self.results)]
        params += ["uniform uint count"]
        params += [f"uniform uint grid_{d}" for d in range(self.rank)]
        params += [
            f"uniform uint stride_{k}_{d}" for k in range(len(self.operands)) for d in range(self.rank)
        ]
        self._body()
        body = "\n".join("    " + line for line in self.lines)
        joined = ",\n    ".join(params)
        return (
            f'import "{module_path}";\nimport slax.kernel;\n\n'
            '[shader("compute")]\n[numthreads(SLAX_GROUP_SIZE, 1, 1)]\n'
            f"void {entry_point_name(self.sig, self.mode)}(\n    {joined})\n{{\n{body}\n}}\n"
        )

    def _body(self) -> None:
        emit = self.lines.append
        emit("uint index = slax_thread_index(thread_id);")
        emit("if (index >= count) return;")
        emit("uint rest = index;")
        for d in reversed(range(self.rank)):
            emit(f"uint c_{d} = rest % grid_{d}; rest = rest / grid_{d};")
        primal_names = {value.name: self._load_value(value, "") for value in self.sig.inputs}
        if self.mode is Mode.PRIMAL:
            self._primal_call(primal_names)
        elif self.mode is Mode.TANGENT:
            self._tangent_call(primal_names)
        else:
            self._cotangent_call(primal_names)

    def _operand_offset(self, k: int) -> str:
        terms = [f"c_{d} * stride_{k}_{d}" for d in range(self.rank)]
        return " + ".join(terms) if terms else "0"

    def _load_value(self, value: Value, role: str, only_differentiable: bool = False) -> str:
        """Declares a local holding ``value`` (or its differential) read from the next operands."""
        var = f"v_{value.name}{role}"
        slang_type = value.slang_type + (".Differential" if role and value.is_struct else "")
        self.lines.append(f"{slang_type} {var} = {{}};")
        for leaf in value.leaves:
            if only_differentiable and not leaf.differentiable:
                continue
            k = self.next_operand
            self.next_operand += 1
            self.lines.append(f"uint o_{k} = ({self._operand_offset(k)}) * {leaf.size};")
            for j, suffix in enumerate(leaf.index_suffixes()):
                self.lines.append(f"{var}{leaf.field_access()}{suffix} = in_{k}[o_{k} + {j}];")
        return var

    def _store_value(self, expression: str, value: Value, only_differentiable: bool) -> None:
        for leaf in value.leaves:
            if only_differentiable and not leaf.differentiable:
                continue
            k = self.next_result
            self.next_result += 1
            for j, suffix in enumerate(leaf.index_suffixes()):
                self.lines.append(
                    f"out_{k}[index * {leaf.size} + {j}] = {expression}{leaf.field_access()}{suffix};"
                )

    def _primal_call(self, primal: dict[str, str]) -> None:
        args = []
        for value in self.sig.params:
            if value.direction is Direction.OUT:
                self.lines.append(f"{value.slang_type} v_{value.name} = {{}};")
                args.append(f"v_{value.name}")
            else:
                args.append(primal[value.name])
        call = f"{self.sig.name}({', '.join(args)})"
        if self.sig.result is not None:
            self.lines.append(f"{self.sig.result.slang_type} v_result = {call};")
        else:
            self.lines.append(call + ";")
        for value in self.sig.outputs:
            self._store_value(f"v_{value.name}", value, only_differentiable=False)

    def _tangent_call(self, primal: dict[str, str]) -> None:
        args = []
        for value in self.sig.params:
            if not _is_diff(value):
                if value.direction is Direction.OUT:
                    self.lines.append(f"{value.slang_type} v_{value.name} = {{}};")
                    args.append(f"v_{value.name}")
                else:
                    args.append(primal[value.name])
                continue
            pair = f"p_{value.name}"
            if value.direction is Direction.OUT:
                self.lines.append(f"{value.slang_type} v_{value.name} = {{}};")
                self.lines.append(f"var {pair} = diffPair(v_{value.name});")
            else:
                tangent = self._load_value(value, "_t", only_differentiable=True)
                self.lines.append(f"var {pair} = diffPair({primal[value.name]}, {tangent});")
            args.append(pair)
        call = f"fwd_diff({self.sig.name})({', '.join(args)})"
        if self.sig.result is not None:
            self.lines.append(f"let p_result = {call};")
        else:
            self.lines.append(call + ";")
        for value in self.sig.outputs:
            if _is_diff(value):
                self._store_value(f"p_{value.name}.d", value, only_differentiable=True)

    def _cotangent_call(self, primal: dict[str, str]) -> None:
        args = []
        pairs = []
        cotangents = {
            value.name: self._load_value(value, "_ct", only_differentiable=True)
            for value in self.sig.outputs
            if _is_diff(value)
        }
        for value in self.sig.params:
            if not _is_diff(value):
                if value.direction is Direction.OUT:
                    continue
                args.append(primal[value.name])
            elif value.direction is Direction.OUT:
                args.append(cotangents[value.name])
            else:
                pair = f"p_{value.name}"
                if value.direction is Direction.INOUT:
                    self.lines.append(
                        f"var {pair} = diffPair({primal[value.name]}, {cotangents[value.name]});"
                    )
                else:
                    self.lines.append(f"var {pair} = diffPair({primal[value.name]});")
                args.append(pair)
                pairs.append(value)
        if "result" in cotangents:
            args.append(cotangents["result"])
        self.lines.append(f"bwd_diff({self.sig.name})({', '.join(args)});")
        for value in pairs:
            self._store_value(f"p_{value.name}.d", value, only_differentiable=True)


def _ctype(leaf: Leaf) -> str:
    return SLANG_SCALAR_FOR_DTYPE[leaf.dtype]
