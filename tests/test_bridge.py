"""Hand-written kernels on JAX arrays vs NumPy, through the bridge (slax/_bridge.py) and slang_kernel_p
(slax/_kernel.py, slax/_kernel_primitive.py): values, in place, vmap, and no derivative but a custom VJP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import parameter_product

import slax
from slax.testing import RELATIVE_TOLERANCE, multiply_add_results

KERNELS = {
    "float32": "scale_shift_float",
    "float16": "scale_shift_half",
    "int32": "scale_shift_int",
}
SHAPES = [(1,), (7,), (3, 5), (2, 3, 4, 5), (130, 65)]
JAX = pytest.mark.jax_version
"""Marks the tests CI runs on every JAX release: one per way a kernel call meets JAX (eager, jit,
scan, in place, vmap, differentiation, traced arguments, XLA's buffers); the dtypes, shapes and
argument checks differ in what slax generates or checks, which no JAX release changes."""


@pytest.fixture(scope="module")
def module():
    return slax.load_module("kernels/scale_shift.slang")


def _draw(rng, shape, dtype):
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape).astype(np.int32)
    return rng.uniform(-4, 4, size=shape).astype(dtype)


def _scale_shift(module, x, a, b):
    kernel = module.kernel(KERNELS[str(x.dtype)])
    (y,) = kernel(x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=a, b=b)
    return y


def _expected(x, a, b):
    return (np.asarray(a, x.dtype) * x + np.asarray(b, x.dtype)).astype(x.dtype)


def _assert_multiply_add(got, a, x, b, then=lambda r: r):
    """``got`` is ``then(a * x + b)`` with ``a * x + b`` rounded as NumPy does, or rounded once (a
    fused multiply-add, as CUDA compiles it), element by element."""
    results = [then(r) for r in multiply_add_results(a, x, b)]
    wrong = ~np.logical_or.reduce([np.asarray(got) == r for r in results])
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {wrong.size} elements are neither a*x+b rounded twice nor once; first "
        f"at {np.argwhere(wrong)[0]}: got {np.asarray(got)[wrong][0]}, expected one of "
        f"{[r[wrong][0] for r in results]}"
    )


@pytest.mark.parametrize(
    ("dtype", "shape"),
    parameter_product(list(KERNELS), SHAPES, marks=lambda case: [JAX] * (case == ("float32", (3, 5)))),
)
def test_eager_matches_numpy(module, rng, dtype, shape):
    x = _draw(rng, shape, dtype)
    a, b = (3, -7) if dtype == "int32" else (1.5, -0.25)
    y = _scale_shift(module, jnp.asarray(x), a, b)
    assert y.shape == shape and y.dtype == dtype
    _assert_multiply_add(y, a, x, b)


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=JAX), "float16", "int32"])
def test_jit_matches_numpy(module, rng, dtype):
    x = _draw(rng, (17, 3), dtype)
    a, b = (2, 5) if dtype == "int32" else (0.5, 2.0)
    y = jax.jit(lambda x: _scale_shift(module, x, a, b) + x)(x)
    _assert_multiply_add(y, a, x, b, then=lambda r: r + x)


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=JAX), "int32"])
def test_scan_with_1000_steps(module, rng, dtype):
    """y <- a*y + b, 1000 times inside one lax.scan, against the same recurrence in NumPy."""
    x = _draw(rng, (4, 33), dtype)
    a, b = (1, 3) if dtype == "int32" else (0.999, 0.001)

    def step(y, _):
        return _scale_shift(module, y, a, b), None

    y = np.asarray(jax.jit(lambda x: jax.lax.scan(step, x, None, length=1000)[0])(x))
    if dtype == "int32":
        expected = x
        for _ in range(1000):
            expected = _expected(expected, a, b)
        np.testing.assert_array_equal(y, expected)
        return
    # The recurrence rounded as NumPy rounds it and as a fused multiply-add rounds it: the two
    # drift apart by up to 2e-4 over 1000 steps, so the kernel must follow one of them closely (on
    # the H100, 2026-11-23: the fused one, bit for bit where the log showed elements).
    separate, fused = x, x
    for _ in range(1000):
        separate = _expected(separate, a, b)
        fused = multiply_add_results(a, fused, b)[1]
    errors = [np.max(np.abs(y - e) / np.abs(e)) for e in (separate, fused)]
    assert min(errors) < 1e-5, errors


@pytest.mark.parametrize("size", [1, pytest.param(5, marks=JAX), 4099])
def test_in_place_kernel_updates_a_loop_carry(module, rng, size):
    """``scale_shift_float_in_place`` (four elements a thread, a quarter of the array apart) updates
    its operand in place: every element once, whether the size divides by four or not, and as a
    fori_loop's carry (the loop bridge_check times against XLA's op)."""
    kernel = module.kernel("scale_shift_float_in_place")

    def update(y):
        results = [jax.ShapeDtypeStruct(y.shape, y.dtype)]
        return kernel(y, results=results, threads=-(-size // 4), a=1.5, b=-0.25, in_place={0: 0})[0]

    x = _draw(rng, (size,), "float32")
    _assert_multiply_add(jax.jit(update)(x), 1.5, x, -0.25)
    looped = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda _, y: update(y), x))(x)
    expected = x
    for _ in range(3):
        expected = _expected(expected, 1.5, -0.25)
    np.testing.assert_allclose(looped, expected, rtol=1e-6, atol=1e-6)


@JAX
def test_vmap_runs_the_kernel_once_per_example(module, rng):
    """Each example's call sees its own operands and counts: rows of different values, an unbatched
    operand shared by all, a mapped axis other than the first, and under jit."""
    kernel = module.kernel("scale_shift_float")
    x = jnp.asarray(_draw(rng, (5, 7), "float32"))

    def call(x, a):
        return kernel(x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=a, b=-0.5)[0]

    per_row = jnp.stack([call(row, 1.5) for row in x])
    np.testing.assert_array_equal(jax.vmap(lambda r: call(r, 1.5))(x), per_row)
    np.testing.assert_array_equal(jax.jit(jax.vmap(lambda r: call(r, 1.5), in_axes=1))(x.T), per_row)
    np.testing.assert_array_equal(jax.vmap(lambda r: call(x[0], 1.5) + r)(x), call(x[0], 1.5) + x)


@JAX
def test_vmap_of_an_in_place_call_updates_each_examples_copy(module, rng):
    """A result updated in place is per example even where its operand is shared: each example
    writes into its own copy, and the shared operand is left as it was."""
    kernel = module.kernel("scale_shift_float")
    x = jnp.asarray(_draw(rng, (3, 6), "float32"))
    start = jnp.full((6,), 7.0, jnp.float32)

    def write_into(x, out):
        result = [jax.ShapeDtypeStruct(out.shape, out.dtype)]
        return kernel(x, out, results=result, threads=x.size, in_place={1: 0}, a=2.0, b=1.0)[0]

    got = jax.jit(jax.vmap(write_into, in_axes=(0, None)))(x, start)
    np.testing.assert_array_equal(got, 2 * np.asarray(x) + 1)
    np.testing.assert_array_equal(start, np.full(6, 7.0, np.float32))


@pytest.mark.parametrize("transform", ["grad", pytest.param("jvp", marks=JAX), "vjp"])
def test_differentiating_a_kernel_says_how_to_attach_a_derivative(module, transform):
    kernel = module.kernel("scale_shift_float")

    def f(x):
        return kernel(x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=2.0, b=1.0)[0]

    x = jnp.ones(4)
    differentiate = {
        "grad": lambda: jax.grad(lambda x: f(x).sum())(x),
        "jvp": lambda: jax.jvp(f, (x,), (x,)),
        "vjp": lambda: jax.vjp(f, x),
    }[transform]
    with pytest.raises(TypeError, match=r"kernel 'scale_shift_float' .*has no derivative.*jax\.custom_vjp"):
        differentiate()


@JAX
def test_a_kernel_with_a_custom_vjp_differentiates(module, rng):
    """What the error above advises: y = a x + b with its backward pass, dx = a dy, run by the
    same kernel; jax.grad then goes through the kernel call."""
    kernel = module.kernel("scale_shift_float")

    def scale_shift(x, a, b):
        return kernel(x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=a, b=b)[0]

    @jax.custom_vjp
    def f(x):
        return scale_shift(x, 3.0, 1.0)

    f.defvjp(lambda x: (f(x), None), lambda _, dy: (scale_shift(dy, 3.0, 0.0),))
    x = jnp.asarray(_draw(rng, (9,), "float32"))
    np.testing.assert_allclose(
        jax.grad(lambda x: jnp.sum(f(x) ** 2))(x), 6.0 * (3.0 * x + 1.0), rtol=RELATIVE_TOLERANCE["float32"]
    )


def test_non_contiguous_numpy_input_is_handled(module, rng):
    x = _draw(rng, (6, 8), "float32")[:, ::2].T
    assert not x.flags.c_contiguous
    y = _scale_shift(module, jnp.asarray(x), 2.0, 1.0)
    np.testing.assert_array_equal(np.asarray(y), _expected(np.ascontiguousarray(x), 2.0, 1.0))


@JAX
def test_empty_launch_returns_empty(module):
    x = jnp.zeros((0,), jnp.float32)
    assert _scale_shift(module, x, 1.0, 1.0).shape == (0,)


@JAX
def test_no_threads_gives_zeros_or_the_operand_in_place(module, rng):
    """A launch of zero threads writes nothing: fresh results are zeros, never uninitialised
    memory, and results updated in place are their operands unchanged (on every launch route)."""
    kernel = module.kernel("scale_shift_float")
    x = jnp.asarray(rng.normal(size=6), jnp.float32)
    result = jax.ShapeDtypeStruct((6,), jnp.float32)
    (fresh,) = jax.jit(lambda x: kernel(x, results=[result], threads=0, a=2.0, b=1.0))(x)
    np.testing.assert_array_equal(np.asarray(fresh), np.zeros(6, np.float32))
    y = x + 1
    (kept,) = jax.jit(lambda x, y: kernel(x, y, results=[result], threads=0, in_place={1: 0}, a=2.0, b=1.0))(
        x, y
    )
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(y))


def test_more_threads_than_elements_stay_in_bounds(module, rng):
    """The kernel reads its buffers' element counts (x_count, y_count), which slax passes: threads
    beyond them write nothing, here into a result smaller than the operand."""
    kernel = module.kernel("scale_shift_float")
    x = jnp.asarray(rng.normal(size=1000), jnp.float32)
    (y,) = jax.jit(
        lambda x: kernel(x, results=[jax.ShapeDtypeStruct((10,), jnp.float32)], threads=100_000, a=2.0, b=1.0)
    )(x)
    np.testing.assert_array_equal(np.asarray(y), 2 * np.asarray(x[:10]) + 1)
    with pytest.raises(TypeError, match=r"\['x_count'\] are the element counts of its buffers"):
        kernel(x, results=[jax.ShapeDtypeStruct((10,), jnp.float32)], threads=10, x_count=10, a=2.0, b=1.0)


@JAX
def test_more_threads_than_a_uint_numbers_are_refused_when_traced(module):
    """A launch numbers its threads with a 32-bit uint (shaders/slax/kernel.slang): 2**32 threads
    would wrap to thread 0 and run threads twice. Refused when traced, with the limit and what to
    do; the largest launch that fits lowers."""
    kernel = module.kernel("scale_shift_float")
    x = jax.ShapeDtypeStruct((6,), jnp.float32)

    def lower(threads):
        return jax.jit(lambda x: kernel(x, results=[x], threads=threads, a=2.0, b=1.0)).lower(x)

    lower(2**32 - 1)
    with pytest.raises(
        ValueError,
        match=r"kernel 'scale_shift_float' would launch 4,294,967,296 threads, .* at most "
        r"4,294,967,295\. Split the work over several calls",
    ):
        lower(2**32)


def test_wrong_dtype_names_parameter(module):
    kernel = module.kernel("scale_shift_float")
    x = jnp.ones(4, jnp.float16)
    with pytest.raises(
        TypeError,
        match=r"'scale_shift_float' parameter 'x' points to 'float' \(dtype float32\); got .* float16",
    ):
        kernel(x, results=[jax.ShapeDtypeStruct((4,), jnp.float32)], threads=4, a=1.0, b=0.0)


def test_wrong_number_of_buffers(module):
    kernel = module.kernel("scale_shift_float")
    with pytest.raises(TypeError, match="2 pointer parameters"):
        kernel(jnp.ones(4), results=[], threads=4, a=1.0, b=0.0)


def test_missing_scalar(module):
    kernel = module.kernel("scale_shift_float")
    with pytest.raises(TypeError, match=r"missing: \['b'\]"):
        kernel(
            jnp.ones(4),
            results=[jax.ShapeDtypeStruct((4,), jnp.float32)],
            threads=4,
            a=1.0,
        )


@pytest.mark.parametrize(
    ("scalars", "error", "message"),
    [
        (
            {"a": 3.9, "b": 0},
            TypeError,
            r"scalar 'a' of kernel 'scale_shift_int' \(Slang 'int'\).*non-integral value 3.9",
        ),
        ({"a": 1, "b": None}, TypeError, r"scalar 'b' of kernel 'scale_shift_int' \(Slang 'int'\) is None"),
        ({"a": 2**31, "b": 0}, ValueError, r"scalar 'a' .*int32 values .* got 2147483648"),
    ],
)
def test_scalars_their_type_would_change_are_refused(module, scalars, error, message):
    kernel = module.kernel("scale_shift_int")
    x = jnp.arange(4, dtype=jnp.int32)
    with pytest.raises(error, match=message):
        kernel(x, results=[jax.ShapeDtypeStruct((4,), jnp.int32)], threads=4, **scalars)
    with pytest.raises(TypeError, match=r"threads of kernel 'scale_shift_int' is an integer .* 4.5"):
        kernel(x, results=[jax.ShapeDtypeStruct((4,), jnp.int32)], threads=4.5, a=1, b=0)


def test_negative_uint_scalar_is_refused():
    source = (
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void fill(uint3 t : SV_DispatchThreadID, uniform float* y, uniform uint count)\n"
        "{ if (t.x < count) y[t.x] = 1; }\n"
    )
    kernel = slax.load_module_from_source("uint_scalar", source).kernel("fill")
    with pytest.raises(ValueError, match=r"scalar 'count' .*\(Slang 'uint'\) takes uint32 values .* got -4"):
        kernel(results=[jax.ShapeDtypeStruct((4,), jnp.float32)], threads=4, count=-4)


def test_missing_kernel_name(module):
    with pytest.raises(ValueError, match="has no entry point 'scale_shift_double'"):
        module.kernel("scale_shift_double")


def test_syntax_error_carries_file_and_line(tmp_path):
    source = tmp_path / "broken.slang"
    source.write_text("float ok(float x) { return x; }\n\nfloat broken(float x) { return x +; }\n")
    with pytest.raises(slax.SlangCompileError, match=r"broken\.slang[:(]3"):
        slax.load_module(source)


@JAX
def test_code_generation_error_surfaces_at_trace_time_with_file_and_line(tmp_path):
    """Some errors appear only when the pipeline is built (here a loop that cannot be unrolled):
    they too raise SlangCompileError when the call is traced, not at its first launch."""
    source = tmp_path / "unrollable.slang"
    source.write_text(
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count)\n{\n"
        "    [ForceUnroll]\n    for (uint i = 0; i < count; i++) x[i] = 0;\n}\n"
    )
    kernel = slax.load_module(source).kernel("k")
    x = jnp.ones(4)
    call = jax.jit(
        lambda x: kernel(
            x, results=[jax.ShapeDtypeStruct((4,), x.dtype)], threads=1, in_place={0: 0}, count=4
        )
    )
    with pytest.raises(slax.SlangCompileError, match=r"(?s)unroll.*unrollable\.slang[:(]6"):
        call.trace(x).lower()


@JAX
def test_failing_dispatch_is_explained(module, monkeypatch):
    """A dispatch that fails (as on a lost device) surfaces with the kernel, device and advice
    (SlangPy's dispatch, which on CUDA is the SlangPy route)."""
    from slax import _bridge, _compile

    real = _compile.compile_kernel

    class FailingKernel:
        def dispatch(self, *args, **kwargs):
            raise RuntimeError("VK_ERROR_DEVICE_LOST")

    def failing(device, spec):
        compiled = real(device, spec)
        return _compile.CompiledKernel(FailingKernel(), compiled.parameters)

    monkeypatch.setattr(_bridge, "compile_kernel", failing)
    x = jnp.arange(7, dtype=jnp.float32) + 0.5  # a shape no other test compiled
    with (
        slax.config.override(cuda_launch="slangpy"),
        pytest.raises(Exception, match=r"(?s)'scale_shift_float' on .*VK_ERROR_DEVICE_LOST.*restart"),
    ):
        jax.block_until_ready(jax.jit(lambda x: _scale_shift(module, x, 3.0, 1.0))(x))


_ADDRESS_OF = """
import slax.kernel;

// Writes the address its pointer x received, as two 32-bit words (low, high).
[shader("compute")]
[numthreads(SLAX_GROUP_SIZE, 1, 1)]
void address_of(uint3 thread_id : SV_DispatchThreadID, uniform float* x, uniform uint* address)
{
    uint64_t value = bit_cast<uint64_t>(x);
    if (slax_thread_index(thread_id) == 0)
    {
        address[0] = uint(value);
        address[1] = uint(value >> 32);
    }
}
"""


@JAX
def test_the_cpu_device_reads_xlas_buffers_in_place(device_kind):
    """On SlangPy's CPU device ("host-pointer") a kernel's pointer is the address of XLA's own
    buffer: no copy. The host-copy route (Vulkan) hands it a device buffer's address instead."""
    if device_kind == "cuda":
        pytest.skip("JAX on CUDA: the zero-copy CUDA routes are checked by experiments/bridge_check.py")
    kernel = slax.load_module_from_source("address_of", _ADDRESS_OF).kernel("address_of")
    x = jnp.arange(1024, dtype=jnp.float32)
    (words,) = jax.jit(lambda x: kernel(x, results=[jax.ShapeDtypeStruct((2,), jnp.uint32)], threads=1))(x)
    low, high = (int(word) for word in np.asarray(words))
    received = low | high << 32
    assert (received == x.unsafe_buffer_pointer()) == (slax.launch_route() == "host-pointer")


@pytest.mark.parametrize("traced", [pytest.param("a", marks=JAX), "threads"])
def test_traced_scalars_of_a_kernel_are_refused_naming_them(module, traced):
    """A kernel's scalars and thread count are fixed when the call is traced; a jitted argument
    passed as one is refused naming it and saying what to do, not with JAX's
    TracerArrayConversionError."""
    kernel = module.kernel("scale_shift_float")
    result = [jax.ShapeDtypeStruct((4,), jnp.float32)]

    def call(x, value):
        arguments = {"threads": 4, "a": 2.0, "b": 1.0} | {traced: value}
        return kernel(x, results=result, **arguments)

    with pytest.raises(
        TypeError, match=rf"kernel 'scale_shift_float': {traced} got a traced value.*static_argnames"
    ):
        jax.jit(call)(jnp.arange(4.0), 4)
