"""Slang source for the MLP kernels of one architecture (layer sizes and dtype).

The network is a chain of ``FeedForwardLayer``s from ``shaders/nn/mlp.slang``: LeakyReLU (slope
0.01) on hidden layers, affine output layer (slope 1). Three entry points share one ``Network``:

- ``mlp_forward``: ``x, params -> y``.
- ``mlp_backward``: ``x, dy, params -> partial grads, dx``; ``bwd_diff`` of the network.
- ``mlp_loss_grad``: ``x, target, params -> partial grads, loss``; per-sample squared error
  and ``bwd_diff`` of it scaled by ``loss_scale`` (1/batch for a mean): a training step's one pass.

All parameters come through one pointer, ``params``: each layer's weight (out x in, row-major) then
its bias, layer after layer (:func:`parameter_offsets`); the gradients go to ``grads`` in the same
layout, one such block per thread group. So a kernel takes five pointers and a few scalars however
deep the network: Vulkan passes entry-point arguments as push constants, 256 bytes on lavapipe and
NVIDIA, which four pointers per layer would exceed at seven layers.

Samples form ``groups`` (vmapped calls each have their own group) of ``samples_per_group``; each group
is padded to whole thread groups of SLAX_GROUP_SIZE, so position ``t`` of the launch is sample
``t % padded_per_group`` of group ``t / padded_per_group`` when that is below ``samples_per_group``
(padding positions run with zero cotangents). Each thread group writes one partial weight and bias
gradient per layer (``groupOuterProductSum``); JAX sums the partials of a group. The source is the
same for every target, and so is the launch: on GPUs thread ``t`` runs position ``t`` and the sums
go through ``SCRATCH_FLOATS`` of group-shared memory; on the CPU, which has no group barriers, the
first thread of each thread group runs the group's positions in order (``groupSamples`` in
``shaders/nn/mlp.slang``).
"""

from __future__ import annotations

from slax._compile import GROUP_SIZE
from slax._signature import SLANG_SCALAR_FOR_DTYPE

HIDDEN_SLOPE = 0.01
OUTPUT_SLOPE = 1.0
SCRATCH_BUDGET_FLOATS = 4096
"""Group-shared floats a kernel may use: 16 KiB, the least any Vulkan device offers
(maxComputeSharedMemorySize); CUDA allows 48 KiB of static shared memory."""


def scratch_floats(sizes: tuple[int, ...]) -> int:
    """Group-shared floats for the gradient sums: a whole group's (x, dZ) of the widest layer, or
    the budget (wider layers then pass their samples through it in chunks)."""
    return min(SCRATCH_BUDGET_FLOATS, GROUP_SIZE * max(i + o for i, o in layer_pairs(sizes)))


def layer_pairs(sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    return list(zip(sizes[:-1], sizes[1:]))


def parameter_offsets(sizes: tuple[int, ...]) -> tuple[list[tuple[int, int]], int]:
    """(weight offset, bias offset) of each layer in the flat parameter layout, and its length."""
    offsets, total = [], 0
    for n_in, n_out in layer_pairs(sizes):
        offsets.append((total, total + n_in * n_out))
        total += n_in * n_out + n_out
    return offsets, total


def widest_layer_error(sizes: tuple[int, ...]) -> str | None:
    """Why the gradient kernels cannot run ``sizes``, or None: the backward pass stages one sample's
    layer input and output gradient (in + out floats) in group-shared memory, whose budget
    (``SCRATCH_BUDGET_FLOATS``) every Vulkan device has."""
    for k, (n_in, n_out) in enumerate(layer_pairs(sizes)):
        if n_in + n_out > SCRATCH_BUDGET_FLOATS:
            return (
                f"layer {k} ({n_in} -> {n_out}) is too wide for the gradient kernels: their backward "
                f"pass holds one sample's layer input and output gradient, in + out = {n_in + n_out} "
                f"floats, in {SCRATCH_BUDGET_FLOATS} floats ({SCRATCH_BUDGET_FLOATS * 4 // 1024} KiB) of "
                f"group-shared memory, the least a Vulkan device offers; use layers with in + out <= "
                f"{SCRATCH_BUDGET_FLOATS}"
            )
    return None


def mlp_source(sizes: tuple[int, ...], dtype: str) -> str:
    scalar = SLANG_SCALAR_FOR_DTYPE[dtype]
    layers = layer_pairs(sizes)
    last = len(layers) - 1
    fields = "\n".join(
        f"    FeedForwardLayer<T, {i}, {o}, GroupScratch> layer{k};" for k, (i, o) in enumerate(layers)
    )
    chain = "\n".join(f"        let h{k + 1} = layer{k}.eval(h{k});" for k in range(len(layers)))
    offsets, total = parameter_offsets(sizes)
    n_in, n_out = sizes[0], sizes[-1]

    def setup(with_gradients: bool) -> str:
        lines = []
        for k, (w, b) in enumerate(offsets):
            dw, db = (
                (f"grads + block * {total} + {w}", f"grads + block * {total} + {b}")
                if with_gradients
                else ("nullptr",) * 2
            )
            lines += [
                f"    net.layer{k}.weights = params + {w};",
                f"    net.layer{k}.bias = params + {b};",
                f"    net.layer{k}.negativeSlope = {OUTPUT_SLOPE if k == last else HIDDEN_SLOPE};",
                f"    net.layer{k}.weightGradient = {dw};",
                f"    net.layer{k}.biasGradient = {db};",
            ]
        return "\n".join(lines)

    locate = """
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;  // whole thread groups only: count is a multiple of the group size
    uint block = thread / SLAX_GROUP_SIZE, first, end;
    groupSamples(thread % SLAX_GROUP_SIZE, first, end);"""
    at_sample = "\n".join(
        [
            "        uint position = block * SLAX_GROUP_SIZE + local, inGroup = position % padded_per_group;",
            "        bool active = inGroup < samples_per_group;",
            "        uint sample = (position / padded_per_group) * samples_per_group"
            " + min(inGroup, samples_per_group - 1);",
        ]
        + [f"        net.layer{k}.local = local;" for k in range(len(layers))]
    )
    return f"""import slax.kernel;
import nn.mlp;

typealias T = {scalar};

groupshared float scratch[{scratch_floats(sizes)}];

struct GroupScratch : IGroupScratch
{{
    static const uint capacity = {scratch_floats(sizes)};
    static void store(uint index, float value) {{ scratch[index] = value; }}
    static float load(uint index) {{ return scratch[index]; }}
}}

struct Network
{{
{fields}

    [Differentiable]
    [NoDiffThis]
    MLVec<T, {n_out}> eval(MLVec<T, {n_in}> h0)
    {{
{chain}
        return h{len(layers)};
    }}
}}

[Differentiable]
MLVec<T, {n_out}> networkOutput(no_diff Network net, MLVec<T, {n_in}> x)
{{
    return net.eval(x);
}}

[Differentiable]
float sampleLoss(no_diff Network net, MLVec<T, {n_in}> x, no_diff MLVec<T, {n_out}> target)
{{
    return squaredError<T, {n_out}>(net.eval(x), target);
}}

MLVec<T, N> loadVec<let N : int>(T* data, uint index)
{{
    MLVec<T, N> v;
    for (int i = 0; i < N; i++) v.vals[i] = data[index * N + i];
    return v;
}}

[shader("compute")]
[numthreads(SLAX_GROUP_SIZE, 1, 1)]
void mlp_forward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* params,
                 uniform T* y, uniform uint count)
{{
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;
    Network net;
{setup(False)}
    MLVec<T, {n_out}> out = net.eval(loadVec<{n_in}>(x, thread));
    for (int i = 0; i < {n_out}; i++) y[thread * {n_out} + i] = out.vals[i];
}}

[shader("compute")]
[numthreads(SLAX_GROUP_SIZE, 1, 1)]
void mlp_backward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* dy,
                  uniform T* params, uniform float* grads, uniform T* dx,
                  uniform uint count, uniform uint samples_per_group, uniform uint padded_per_group)
{{{locate}
    Network net;
{setup(True)}
    for (uint local = first; local < end; local++)
    {{
{at_sample}
        var input = diffPair(loadVec<{n_in}>(x, sample));
        MLGrad<{n_out}> dOut;
        for (int i = 0; i < {n_out}; i++)
            dOut.vals[i] = active ? __realCast<float>(dy[sample * {n_out} + i]) : 0.0;
        bwd_diff(networkOutput)(net, input, dOut);
        if (active)
            for (int i = 0; i < {n_in}; i++) dx[sample * {n_in} + i] = __realCast<T>(input.d.vals[i]);
    }}
}}

[shader("compute")]
[numthreads(SLAX_GROUP_SIZE, 1, 1)]
void mlp_loss_grad(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* target,
                   uniform T* params, uniform float* grads, uniform float* loss,
                   uniform uint count, uniform uint samples_per_group, uniform uint padded_per_group,
                   uniform float loss_scale)
{{{locate}
    Network net;
{setup(True)}
    for (uint local = first; local < end; local++)
    {{
{at_sample}
        MLVec<T, {n_in}> input = loadVec<{n_in}>(x, sample);
        MLVec<T, {n_out}> goal = loadVec<{n_out}>(target, sample);
        if (active)
            loss[sample] = sampleLoss(net, input, goal);
        var inputPair = diffPair(input);
        bwd_diff(sampleLoss)(net, inputPair, goal, active ? loss_scale : 0.0);
    }}
}}
"""
