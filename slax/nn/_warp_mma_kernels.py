"""Slang source for a narrow float16 network's fused loss and gradient on NVIDIA tensor cores, a warp
per tile of 16 samples (``shaders/nn/warp_mma.slang``), for JAX on CUDA.

The kernel replaces the per-sample ``mlp_loss_grad`` of slax/nn/_kernels.py where
``KernelLayout.warp_mma`` says so, behind the same declaration (:data:`LOSS_GRAD_ENTRY`): the same
operands and scalars, launch and row of partial sums per thread group, so the primitive runs either
alike. Thread group ``block`` covers the same SLAX_GROUP_SIZE * samples_per_thread samples of its
vmapped group as the per-sample kernel's, split between its warps: 32 * samples_per_thread
consecutive samples each, in tiles of 16 whose padding rows (past the group's end) repeat the
group's last sample and count for nothing. The network's other kernels run a sample per thread.
"""

from __future__ import annotations

from slax._compile import GROUP_SIZE

WARP_MMA_WIDTH = 16
"""Widest layer (in or out) the kernel runs: one block of 16 columns."""
WARP_MMA_THREADS_WANTED = 1 << 16
"""THREADS_WANTED (slax/nn/_kernels.py) of this kernel, whose threads hold 64 registers against the
per-sample kernel's 254. Measured on an H100 (4-16-4, float16, 2^20 samples, ``mlp_loss_grad`` alone;
BENCHMARKS.md): 2^16 and 2^17 threads took 21.9-22.2 and 22.2 us; an earlier version of the kernel
(two products per gradient term) took 40.6, 26.7 and 27.8 us at 2^15, 2^16 and 2^17."""

LOSS_GRAD_ENTRY = """
[shader("compute")]
[numthreads(SLAX_GROUP_SIZE, 1, 1)]
void mlp_loss_grad(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* target,
                   uniform float* params, uniform float* partials, uniform uint count,
                   uniform uint samples_per_group, uniform uint blocks_per_group,
                   uniform uint samples_per_thread, uniform float loss_scale)"""
"""The declaration of ``mlp_loss_grad``, whichever kernel runs it (a sample per thread, or warp
tiles)."""


def warp_mma_loss_grad(
    layers: list[tuple[int, int]], offsets: list[int], activations: list[str], row: int, scratch: int
) -> str:
    """``mlp_loss_grad`` of the network whose layers are ``layers`` ((in, out) pairs, at most
    WARP_MMA_WIDTH wide), starting at ``offsets`` in the flat parameter layout, with
    ``activations`` (``IActivation`` types, ``shaders/nn/activations.slang``), writing rows of
    ``row`` partial sums. Each warp leaves its sums in a row
    of the preamble's group-shared ``GroupScratch`` (``scratch`` floats), and the thread group adds
    the warps' rows in order."""
    if GROUP_SIZE // 32 * row > scratch:
        raise ValueError(
            f"slax: {GROUP_SIZE // 32} warps' rows of {row} sums exceed {scratch} scratch floats."
        )
    sizes = [layers[0][0]] + [n_out for _, n_out in layers]
    last = len(layers) - 1
    setup = "\n".join(
        f"    let layer{k} = HalfLayer<{i}, {o}, {w}, {activation}>(params, lane);\n"
        f"    var sums{k} = HalfLayerSums();"
        for k, ((i, o), w, activation) in enumerate(zip(layers, offsets, activations))
    )
    forward = "\n".join(
        f"        uint4 kept{k + 1};\n        let h{k + 1} = layer{k}.forward(h{k}, kept{k + 1});"
        for k in range(len(layers))
    )
    backward = []
    for k in reversed(range(len(layers))):
        input_gradient = "true" if k else "false"  # nothing reads the input's gradient
        backward.append(f"        layer{k}.backward(h{k}, d{k + 1}, sums{k}, {input_gradient}, d{k});")
        if k:
            backward.append(f"        layer{k - 1}.activationGradient(kept{k}, d{k});")
    gradients = " ".join(f"float4 d{k}[2];" for k in range(len(layers) + 1))
    reduce = "\n".join(
        f"    for (int j = 0; j < 2; j++) sums{k}.bias[j] = reduceOverRows(sums{k}.bias[j]);\n"
        f"    layer{k}.store<GroupScratch>(sums{k}, lane, warp * {row});"
        for k in range(len(layers))
    )
    return f"""{LOSS_GRAD_ENTRY}
{{
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;  // whole thread groups only: count is a multiple of the group size
    uint block = thread / SLAX_GROUP_SIZE, local = thread % SLAX_GROUP_SIZE;
    uint warp = local / 32, lane = local % 32, g = lane / 4, t = lane % 4;
{setup}
    float loss = 0.0;
    uint groupStart = (block / blocks_per_group) * samples_per_group;
    uint warpStart = ((block % blocks_per_group) * SLAX_GROUP_SIZE + warp * 32) * samples_per_thread;
    uint tiles = 2 * samples_per_thread;
    uint nextTop = groupStart + min(warpStart + g, samples_per_group - 1);
    uint nextBottom = groupStart + min(warpStart + g + 8, samples_per_group - 1);
    var nextInput = loadRows<{sizes[0]}>(x, nextTop, nextBottom, t);
    var nextTarget = loadRows<{sizes[-1]}>(target, nextTop, nextBottom, t);
    for (uint tile = 0; tile < tiles; tile++)
    {{
        // This tile's rows were loaded while the one before ran; the next tile's load now.
        uint rowTop = warpStart + tile * 16 + g;  // in the vmapped group; rowTop + 8 the bottom row
        bool activeTop = rowTop < samples_per_group, activeBottom = rowTop + 8 < samples_per_group;
        let h0 = nextInput;
        let targetRows = nextTarget;
        if (tile + 1 < tiles)
        {{
            nextTop = groupStart + min(rowTop + 16, samples_per_group - 1);
            nextBottom = groupStart + min(rowTop + 24, samples_per_group - 1);
            nextInput = loadRows<{sizes[0]}>(x, nextTop, nextBottom, t);
            nextTarget = loadRows<{sizes[-1]}>(target, nextTop, nextBottom, t);
        }}
{forward}
        {gradients}
        loss += squaredErrors<{sizes[-1]}>(h{last + 1}, targetRows, activeTop, activeBottom, t, d{last + 1});
        layer{last}.activationGradient(kept{last + 1}, d{last + 1});
{chr(10).join(backward)}
    }}
{reduce}
    loss = reduceOverLanes(loss);
    if (lane == 0) GroupScratch.store(warp * {row} + {row - 1}, loss);
    groupBarrier();
    for (uint index = local; index < {row}; index += SLAX_GROUP_SIZE)
    {{
        float sum = 0.0;
        for (uint w = 0; w < SLAX_GROUP_SIZE / 32; w++) sum += GroupScratch.load(w * {row} + index);
        // the gradients' factor 2 (squaredErrors), and the loss's weight in the batch
        partials[block * {row} + index] = sum * (index == {row - 1} ? loss_scale : 2.0 * loss_scale);
    }}
}}
"""
