"""Slang source for the MLP kernels of one architecture (layer sizes and dtype).

The network is a chain of ``FeedForwardLayer``s from ``shaders/nn/mlp.slang``: LeakyReLU (slope
0.01) on hidden layers, affine output layer (slope 1). Three entry points share one ``Network``:

- ``mlp_forward``: ``x, params -> y``.
- ``mlp_backward``: ``x, dy, params, grads (in place) -> dx``; ``bwd_diff`` of the network, whose
  layers' custom derivatives add each sample's weight/bias gradients into the float32 buffers of its
  group (``index / samples_per_group``).
- ``mlp_loss_grad``: ``x, target, params, grads (in place) -> loss``; per-sample squared error and
  ``bwd_diff`` of it scaled by ``loss_scale`` (1/batch for a mean), one pass for a training step.

All parameters are uniform pointers and scalars (the slax kernel calling convention).
"""

from __future__ import annotations

from slax._signature import SLANG_SCALAR_FOR_DTYPE

HIDDEN_SLOPE = 0.01
OUTPUT_SLOPE = 1.0


def mlp_source(sizes: tuple[int, ...], dtype: str) -> str:
    scalar = SLANG_SCALAR_FOR_DTYPE[dtype]
    layers = list(zip(sizes[:-1], sizes[1:]))
    last = len(layers) - 1
    fields = "\n".join(f"    FeedForwardLayer<T, {i}, {o}> layer{k};" for k, (i, o) in enumerate(layers))
    chain = "\n".join(f"        let h{k + 1} = layer{k}.eval(h{k});" for k in range(len(layers)))
    param_ptrs = ", ".join(f"uniform T* w{k}, uniform T* b{k}" for k in range(len(layers)))
    grad_ptrs = ", ".join(f"uniform float* dw{k}, uniform float* db{k}" for k in range(len(layers)))
    n_in, n_out = sizes[0], sizes[-1]

    def setup(with_grads: bool) -> str:
        lines = []
        for k, (i, o) in enumerate(layers):
            slope = OUTPUT_SLOPE if k == last else HIDDEN_SLOPE
            lines += [
                f"    net.layer{k}.weights = w{k};",
                f"    net.layer{k}.bias = b{k};",
                f"    net.layer{k}.negativeSlope = {slope};",
            ]
            if with_grads:
                lines += [
                    f"    net.layer{k}.weightsGrad = dw{k} + group * {i * o};",
                    f"    net.layer{k}.biasGrad = db{k} + group * {o};",
                ]
            else:
                lines += [
                    f"    net.layer{k}.weightsGrad = nullptr;",
                    f"    net.layer{k}.biasGrad = nullptr;",
                ]
        return "\n".join(lines)

    head = """
    uint index = slax_thread_index(thread_id);
    if (index >= count) return;"""
    return f"""import slax.kernel;
import nn.mlp;

typealias T = {scalar};

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
[numthreads(64, 1, 1)]
void mlp_forward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, {param_ptrs},
                 uniform T* y, uniform uint count)
{{{head}
    uint group = 0;
    Network net;
{setup(False)}
    MLVec<T, {n_out}> out = net.eval(loadVec<{n_in}>(x, index));
    for (int i = 0; i < {n_out}; i++) y[index * {n_out} + i] = out.vals[i];
}}

[shader("compute")]
[numthreads(64, 1, 1)]
void mlp_backward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* dy, {param_ptrs},
                  {grad_ptrs}, uniform T* dx, uniform uint count, uniform uint samples_per_group)
{{{head}
    uint group = index / samples_per_group;
    Network net;
{setup(True)}
    var input = diffPair(loadVec<{n_in}>(x, index));
    MLVec<T, {n_out}> dOut = loadVec<{n_out}>(dy, index);
    MLGrad<{n_out}> dOutGrad;
    for (int i = 0; i < {n_out}; i++) dOutGrad.vals[i] = __realCast<float>(dOut.vals[i]);
    bwd_diff(networkOutput)(net, input, dOutGrad);
    for (int i = 0; i < {n_in}; i++) dx[index * {n_in} + i] = __realCast<T>(input.d.vals[i]);
}}

[shader("compute")]
[numthreads(64, 1, 1)]
void mlp_loss_grad(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* target,
                   {param_ptrs}, {grad_ptrs}, uniform float* loss, uniform uint count,
                   uniform uint samples_per_group, uniform float loss_scale)
{{{head}
    uint group = index / samples_per_group;
    Network net;
{setup(True)}
    MLVec<T, {n_in}> input = loadVec<{n_in}>(x, index);
    MLVec<T, {n_out}> goal = loadVec<{n_out}>(target, index);
    loss[index] = sampleLoss(net, input, goal);
    var inputPair = diffPair(input);
    bwd_diff(sampleLoss)(net, inputPair, goal, loss_scale);
}}
"""
