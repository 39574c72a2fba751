"""Slang source for the MLP kernels of one architecture (layer sizes and dtype).

The network is a chain of ``FeedForwardLayer``s from ``shaders/nn/mlp.slang``, each with its
activation's Slang type (slax/nn/_activations.py; by default LeakyReLU on hidden layers, an affine
output layer). Every kernel family has these entry points:

- ``mlp_forward``: ``x, params -> y``.
- ``mlp_backward``: ``x, dy, params -> partial sums, dx``; ``bwd_diff`` of the network.
- ``mlp_backward_params``: ``x, dy, params -> partial sums``, the same without ``dx``, where
  nothing reads it (slax/nn/_primitives.py, ``_backward_dead_code``: a training step's gradient,
  whose data need none); wide networks' kernels then skip the first layer's input-gradient
  product (about a quarter of the digits network's backward products).
- wide networks only: ``mlp_input_gradient``, ``mlp_backward``'s operands and results, ``dx``
  alone computed, where nothing reads the parameters' gradients (``_backward_dead_code`` again:
  the input gradient inside an eikonal loss); and (:func:`hidden_width`) ``mlp_forward_hidden``,
  ``x, params -> y, hidden``,
  which keeps each sample's hidden activations, and both backward kernels read them (``x, hidden,
  dy, params -> ...``) instead of running the forward pass again.
- wide networks only, in a source of its own (``tangents``): ``mlp_hessian_sums``, ``x, direction,
  dy, params -> partial sums``, the parameters' part of each sample's Hessian of ``dy .
  network(x)`` along ``direction`` for networks whose activations have zero second derivatives
  (slax/nn/_backends.py, ``Backend.hessian_sums``).
- ``mlp_loss_grad``: ``x, target, params -> partial sums``: ``bwd_diff`` of each sample's squared
  error weighted by ``loss_scale`` (1/batch for a mean), whose backward derivative also adds the
  weighted loss: a training step's loss and gradient in one pass.

All parameters come through one pointer, ``params``, as float32 whatever the network's dtype: each
layer's bias then its weight (out x in, row-major), layer after layer (:func:`parameter_offsets`).
That is the order of ``jax.flatten_util.ravel_pytree(params)`` (a list of ``{"bias", "weight"}``
dicts flattens with the keys sorted), so a training loop that keeps its parameters as that flat
vector hands the kernels their own layout: with float32 parameters XLA packs nothing per step (half
ones are converted to float32, one small fusion), and the gradient it gets back is one slice of the
kernels' summed row (BENCHMARKS.md, "Flat parameters").
So a kernel takes a handful of pointers however deep the network: Vulkan passes entry-point
arguments as push constants, 256 bytes on lavapipe and NVIDIA, which four pointers per layer would
exceed at seven layers.

Samples form ``groups`` (vmapped calls each have their own group) of ``samples_per_group``. Each
thread group writes one row of ``partials``: the sums of its samples' parameter gradients in the
parameter layout, then the sum of their weighted losses (:class:`KernelLayout`); JAX adds the rows
of a group. How a row is summed depends on the network's size:

- narrow networks (``KernelLayout.thread_sums``) run one sample at a time per thread, through
  Slang's ``bwd_diff``, in kernels written once in ``shaders/nn/thread_sums.slang``: the source
  generated here is only a descriptor that includes it (:func:`thread_sums_source`: ``T``, the
  network's type ``Chain<...>`` and its sizes as ``static const`` declarations). Each group is
  covered by ``blocks_per_group`` thread groups of SLAX_GROUP_SIZE threads, each thread running
  ``samples_per_thread`` samples and summing their gradients in registers, then the thread group
  adds its threads' sums; parameters are staged in group-shared memory. For JAX on CUDA with
  tensor cores, float16 networks at most 16 wide compute ``mlp_loss_grad`` a tile of 16 samples
  per warp instead (``shaders/nn/warp_mma.slang``, :func:`warp_mma_fits`; thread_sums.slang's entry
  point, over the descriptor's ``WarpNetwork``), the same thread groups covering the same samples;
- wide ones run a tile of samples at a time per thread group, each layer a matrix product split
  over its threads (slax/nn/_tiled_kernels.py, ``shaders/nn/tiled.slang``), or, for JAX on CUDA,
  over its warps' tensor cores (slax/nn/_tensor_core_kernels.py, ``shaders/nn/tensor_cores.slang``)
  where the network's gradient sums fit their registers; both in kernels written once in
  ``shaders/nn/tile_kernels.slang``, the source generated here again only a descriptor that includes
  it (slax/nn/_tiled_kernels.py, ``tile_kernels_source``: ``T``, the tiles, the chain of layer types
  and the sizes).
"""

from __future__ import annotations

import dataclasses
import functools

from slax._compile import GROUP_SIZE
from slax._signature import SLANG_SCALAR_FOR_DTYPE
from slax.nn._activations import ACTIVATIONS, HIDDEN_DEFAULT, OUTPUT_DEFAULT, layer_activations
from slax.nn._precision import Float32Products
from slax.nn._slang_types import chain_aliases
from slax.nn._tensor_core_kernels import TensorCoreLayout, tensor_core_family, tensor_core_layout
from slax.nn._tiled_kernels import Network, TileLayout, tile_kernels_source, tile_layout, tiled_family
from slax.nn._warp_mma_kernels import WARP_MMA_WIDTH, warp_network_aliases

SCRATCH_BUDGET_FLOATS = 4096
"""Group-shared floats a narrow network's kernels use for their staged parameters and their
thread group's sum: 16 KiB, the least any Vulkan device offers (maxComputeSharedMemorySize)."""
THREAD_SUMS_LIMIT = 160
"""Most floats a thread sums in registers (the parameters' gradients and the loss); a network with
more parameters runs tiled (slax/nn/_tiled_kernels.py). On CUDA a thread has 255 registers, which also
hold its sample's activations: 149 sums (4-16-4) and 158 (4-17-4) compile without spilling, 167
(4-18-4) spill. Measured on an H100 (loss and gradient, 2^20 samples): register sums 28.8 us against
76.4 us through group-shared memory at 149 sums, but 147 against 116 us at 226 (5-20-5) and 236
against 123 us at 243 (6-16-6-4), where they spill (BENCHMARKS.md: those figures compare with
the per-sample group-shared sums that tiles have since replaced)."""
THREADS_WANTED = 1 << 15
"""Threads a gradient launch aims for before a thread runs several samples: summing more samples in
a thread's registers is cheaper than summing more threads' sums, and on an H100 (132
multiprocessors) 32768 threads still fill it at the 254 registers these kernels take. Measured
there (polynomial network, 2^20 samples): 8, 16, 32, 64 samples per thread took 34.9, 30.7, 28.7,
32.6 us; at 2^22: 137.7, 118.3, 108.6, 104.2 us (BENCHMARKS.md)."""
MAX_SAMPLES_PER_THREAD = 64


def layer_pairs(sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    return list(zip(sizes[:-1], sizes[1:]))


def parameter_offsets(sizes: tuple[int, ...]) -> tuple[list[int], int]:
    """Where each layer starts in the flat parameter layout (its bias; its weight follows, ``out``
    floats on), and the layout's length."""
    offsets, total = [], 0
    for n_in, n_out in layer_pairs(sizes):
        offsets.append(total)
        total += n_out + n_in * n_out
    return offsets, total


@dataclasses.dataclass(frozen=True)
class KernelLayout:
    """How the kernels of one architecture sum and read parameters, as their source lays them out
    (the launches of each kernel family: slax/nn/_backends.py).

    Attributes:
      parameters: floats in the flat parameter layout.
      sums: floats in a row of ``partials``: the parameters' gradients, then the loss.
      thread_sums: each thread runs its samples one at a time and sums them in registers (narrow
        networks), else thread groups run tiles of samples (wide ones, ``tile``).
      scratch: group-shared floats for the thread sums' group sum (narrow networks), or the warp
        tiles' rows of sums, one a warp (``warp_mma``).
      tile: the tiles' layout (wide networks; None for narrow ones, or where even one sample's
        tile does not fit: slax/nn/_tiled_kernels.py, ``tile_error``): a :class:`TensorCoreLayout` where the
        kernels run on tensor cores, else a :class:`TileLayout`.
      warp_mma: a narrow float16 network's loss-and-gradient kernel runs on tensor cores, a warp
        per tile of 16 samples (``shaders/nn/warp_mma.slang``; :func:`warp_mma_fits`); its other
        kernels, and every other narrow network's, run a sample per thread.
    """

    parameters: int
    sums: int
    thread_sums: bool
    scratch: int
    tile: TileLayout | TensorCoreLayout | None
    warp_mma: bool = False

    @property
    def tensor_cores(self) -> bool:
        return isinstance(self.tile, TensorCoreLayout)

    @property
    def wide_tile(self) -> TileLayout | TensorCoreLayout:
        """``tile``, of a wide network the kernels can run: no backend that needs it takes the
        others (slax/nn/_backends.py), so no launch asks for it."""
        if self.tile is None:
            why = "a narrow network" if self.thread_sums else "no tile of its kind fits the network"
            raise ValueError(f"slax: no tile layout: {why}.")
        return self.tile


@functools.cache
def kernel_layout(
    sizes: tuple[int, ...], tensor_cores: bool = False, dtype: str = "float32", tangents: bool = False
) -> KernelLayout:
    """How the kernels of ``sizes`` sum and read parameters: a narrow network's per thread (with
    ``tensor_cores``, its fused loss and gradient in warp tiles where :func:`warp_mma_fits`), a
    wide one's in tiles, on tensor cores with ``tensor_cores`` (their layout in ``dtype``, or none
    where it does not exist), else on SIMT cores; with ``tangents``, the tiles of a wide network's
    Hessian kernel (``mlp_hessian_sums``), which hold each layer's input tangent too. Which of these
    a network may take on a platform is its backend's rule (slax/nn/_backends.py,
    ``TensorCores.unfit``), not this function's."""
    _, total = parameter_offsets(sizes)
    thread_sums = total + 1 <= THREAD_SUMS_LIMIT
    tile = None
    if not thread_sums:
        tile = tensor_core_layout(sizes, dtype, tangents) if tensor_cores else tile_layout(sizes, tangents)
    return KernelLayout(
        parameters=total,
        sums=total + 1,
        thread_sums=thread_sums,
        scratch=SCRATCH_BUDGET_FLOATS - total if thread_sums else 0,
        tile=tile,
        warp_mma=tensor_cores and warp_mma_fits(sizes, dtype),
    )


def warp_mma_fits(sizes: tuple[int, ...], dtype: str) -> bool:
    """Whether ``shaders/nn/warp_mma.slang`` runs the loss and gradient of ``sizes`` in ``dtype``
    where JAX runs on CUDA with tensor cores on: narrow networks (whose other kernels run a sample
    per thread) in float16 with every layer at most WARP_MMA_WIDTH wide. float32 stays on CUDA
    cores, exact to ``jax.grad``: on tensor cores each product would take three (3xTF32)."""
    narrow = kernel_layout(sizes).thread_sums  # without tensor cores: asks nothing of this function
    return narrow and dtype == "float16" and max(sizes) <= WARP_MMA_WIDTH


def hidden_width(sizes: tuple[int, ...]) -> int:
    """Values of each sample's hidden activations (every layer's output but the last) that
    ``mlp_forward_hidden`` keeps for ``mlp_backward``, which then runs no forward pass: those of
    wide networks, whose forward pass costs a third of a gradient's products; 0 for narrow ones,
    whose backward kernel recomputes its few activations per sample in registers, cheaper than
    writing and reading them."""
    return 0 if kernel_layout(sizes).thread_sums else sum(sizes[1:-1])


def _chunk(layout: KernelLayout, values: int) -> int:
    """Values per thread in each pass of ``groupSum``: as many as its padded rows leave room for,
    an even number (the rows, one longer, are then odd: no two threads' stores share a bank)."""
    chunk = min(values, GROUP_SIZE, layout.scratch // GROUP_SIZE - 1)
    return chunk - chunk % 2 if chunk > 1 else chunk


def mlp_source(
    sizes: tuple[int, ...],
    dtype: str,
    tensor_cores: bool = False,
    activations: tuple[str, ...] | None = None,
    tangents: bool = False,
    products: Float32Products = Float32Products.FLOAT32,
) -> str:
    """The kernels of ``sizes`` in ``dtype`` with each layer's activation named in ``activations``
    (slax/nn/_activations.py; None: the defaults), those of :func:`kernel_layout` (sizes,
    tensor_cores, dtype, tangents): the source its backend asked for, which checked that they run
    it; with ``tangents``, the wide network's Hessian kernel's; on tensor cores, a float32
    network's products as ``products``."""
    activations = activations or layer_activations(len(sizes) - 1, HIDDEN_DEFAULT, OUTPUT_DEFAULT)
    layout = kernel_layout(sizes, tensor_cores, dtype, tangents)
    types = [ACTIVATIONS[name].slang for name in activations]
    if not layout.thread_sums:
        tile = layout.wide_tile
        network = Network(sizes, layer_pairs(sizes), parameter_offsets(sizes)[0], types, dtype, layout.sums)
        if isinstance(tile, TensorCoreLayout):
            return tile_kernels_source(network, tensor_core_family(network, tile, products))
        return tile_kernels_source(network, tiled_family(network, tile))
    return thread_sums_source(sizes, dtype, types, layout)


def thread_sums_source(
    sizes: tuple[int, ...], dtype: str, activations: list[str], layout: KernelLayout
) -> str:
    """The narrow network's kernels for ``sizes`` in ``dtype``, each layer's ``IActivation`` type
    in ``activations``: a descriptor of the architecture (``T``, ``Network``: its ``Chain`` of
    ``FeedForwardLayer`` types, and its sizes as ``static const``s) that includes
    ``shaders/nn/thread_sums.slang``, where the entry points, the sample loop and the ``Sums`` and
    ``Parameters`` types are written once. The layer offsets in the chain's type are
    :func:`parameter_offsets`', the one definition of the layout that packing and unpacking the
    parameters also read (slax/nn/_backends.py). Where ``layout.warp_mma``, the descriptor also names
    ``WarpNetwork`` (slax/nn/_warp_mma_kernels.py), whose warp tiles then run the file's
    ``mlp_loss_grad``."""
    offsets, _ = parameter_offsets(sizes)
    layers = [
        f"FeedForwardLayer<T, {i}, {o}, {w}, Parameters, Sums, {a}>"
        for (i, o), w, a in zip(layer_pairs(sizes), offsets, activations)
    ]
    chains = [f"Chain<T, {n_in}, {n_out}, {sizes[-1]}, " for n_in, n_out in layer_pairs(sizes)[:-1]]
    imports, warp = "import nn.mlp;\n", ""
    if layout.warp_mma:
        imports += "import nn.warp_mma;\n#define SLAX_WARP_MMA_LOSS_GRAD\n"
        warp = warp_network_aliases(layer_pairs(sizes), offsets, activations, layout.sums, layout.scratch)
    return f"""import slax.kernel;
{imports}
typealias T = {SLANG_SCALAR_FOR_DTYPE[dtype]};
{chain_aliases("Network", chains, layers)}{warp}static const int Inputs = {sizes[0]};
static const int Outputs = {sizes[-1]};
static const int ParameterCount = {layout.parameters};
static const int ScratchFloats = {layout.scratch};
static const int SumChunk = {_chunk(layout, layout.sums)};
#include "nn/thread_sums.slang"
"""
