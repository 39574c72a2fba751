"""How a float32 network's products run (slax/nn/_precision.py): JAX's precision rule, read from a
call's ``precision=`` or from JAX's default matmul precision as the call is traced. Their numbers on
tensor cores: tests/test_tensor_cores.py; their kernels: tests/test_ptx_launch.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from slax import nn
from slax.nn import _backends
from slax.nn._precision import Float32Products, float32_products, twin_precision
from slax.nn._primitives import mlp_forward_p, mlp_loss_grad_p

pytestmark = pytest.mark.one_device_kind

TF32, FLOAT32 = Float32Products.TF32, Float32Products.FLOAT32
Precision, Preset = jax.lax.Precision, jax.lax.DotAlgorithmPreset


@pytest.mark.parametrize(
    ("precision", "products"),
    [
        (Precision.DEFAULT, TF32),
        (Precision.HIGH, TF32),
        (Precision.HIGHEST, FLOAT32),
        ("default", TF32),
        ("fastest", TF32),
        ("bfloat16", TF32),
        ("high", TF32),
        ("tensorfloat32", TF32),
        ("highest", FLOAT32),
        ("float32", FLOAT32),
        ((Precision.DEFAULT, Precision.HIGHEST), FLOAT32),
        (("high", "default"), TF32),
        (Preset.DEFAULT, TF32),
        (Preset.TF32_TF32_F32, TF32),
        ("TF32_TF32_F32", TF32),
        (Preset.TF32_TF32_F32_X3, FLOAT32),
        ("F32_F32_F32", FLOAT32),
    ],
    ids=str,
)
def test_every_precision_jax_accepts_for_tf32_or_float32_products(precision, products):
    assert float32_products("mlp_apply", precision) is products


def test_without_a_precision_the_call_takes_jaxs_default_as_it_is_traced():
    with jax.default_matmul_precision(None):
        assert float32_products("mlp_apply") is TF32  # JAX's own default: XLA's DEFAULT
    for setting, products in [("highest", FLOAT32), ("tensorfloat32", TF32), ("F32_F32_F32", FLOAT32)]:
        with jax.default_matmul_precision(setting):
            assert float32_products("mlp_apply") is products
            assert float32_products("mlp_apply", "default") is TF32  # the argument wins
            assert _backends.BackendRequest.current("mlp_apply").products is products


@pytest.mark.parametrize("precision", ["BF16_BF16_F32", Preset.F16_F16_F32, "float64", 3, ("high",)])
def test_a_precision_the_kernels_do_not_run_is_refused_naming_the_call(precision):
    params = nn.mlp_init(jax.random.key(0), (4, 40, 4))
    x = jnp.zeros((8, 4))
    with pytest.raises(ValueError, match=r"slax\.nn\.mlp_apply: precision is .* which the MLP's kernels"):
        nn.mlp_apply(params, x, precision=precision)
    with pytest.raises(ValueError, match=r"slax\.nn\.mlp_loss_and_grad: precision is"):
        nn.mlp_loss_and_grad(params, x, x, precision=precision)


def test_a_default_the_kernels_do_not_run_is_refused_naming_jaxs_setting():
    params = nn.mlp_init(jax.random.key(0), (4, 40, 4))
    with jax.default_matmul_precision("BF16_BF16_F32"):
        with pytest.raises(
            ValueError, match=r"mlp_apply: JAX's default matmul precision .* is 'BF16_BF16_F32'"
        ):
            nn.mlp_apply(params, jnp.zeros((8, 4)))


def _request(jaxpr, primitive):
    (equation,) = [e for e in jaxpr.eqns if e.primitive is primitive]
    return equation.params["request"]


def test_the_products_are_part_of_the_traced_call():
    """The precision is a static parameter of the MLP's primitives, read when the call is traced:
    jax.default_matmul_precision, which JAX keys its caches by, retraces a jitted call, and the
    argument overrides it."""
    params = nn.mlp_init(jax.random.key(1), (4, 40, 40, 4))
    x = jax.random.uniform(jax.random.key(2), (64, 4))
    for setting, products in [(None, TF32), ("highest", FLOAT32), ("tensorfloat32", TF32)]:
        with jax.default_matmul_precision(setting):
            apply = jax.make_jaxpr(lambda p, v: nn.mlp_apply(p, v))(params, x)
            assert _request(apply.jaxpr, mlp_forward_p).products is products
            fused = jax.make_jaxpr(lambda p, v: nn.mlp_loss_and_grad(p, v, v[:, :4], precision="highest"))
            assert _request(fused(params, x).jaxpr, mlp_loss_grad_p).products is FLOAT32


def test_the_platform_runs_tf32_only_on_tensor_cores(monkeypatch):
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    for products in (TF32, FLOAT32):
        on = _backends.BackendRequest("auto", True, products)
        assert _backends.Platform.of("cuda", on).products is products
        assert _backends.Platform.of("cpu", on).products is FLOAT32
        off = _backends.BackendRequest("auto", False, products)
        assert _backends.Platform.of("cuda", off).products is FLOAT32
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "75")
    assert _backends.Platform.of("cuda", _backends.BackendRequest("auto", True, TF32)).products is FLOAT32


def test_describe_names_the_products_of_a_float32_network_on_tensor_cores(monkeypatch):
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    digits = nn.mlp_init(jax.random.key(3), (64, 128, 64, 10))
    for precision, products in [("default", "(TF32)"), ("highest", "(3xTF32)")]:
        line = nn.describe(digits, (4096, 64), "cuda", precision=precision)["mlp_loss_and_grad"]
        assert line.startswith("tensor_cores: ") and f"as mma.sync {products}" in line
    halves = nn.mlp_init(jax.random.key(3), (64, 128, 64, 10), jnp.float16)
    assert "TF32" not in nn.describe(halves, (4096, 64), "cuda")["mlp_loss_and_grad"]
    assert "TF32" not in nn.describe(digits, (4096, 64), "cpu", precision="default")["mlp_loss_and_grad"]


def test_the_twins_take_the_calls_products_in_float32_and_default_in_half():
    assert twin_precision("float32", TF32) == Precision.DEFAULT
    assert twin_precision("float32", FLOAT32) == Precision.HIGHEST
    assert twin_precision("float16", FLOAT32) == twin_precision("float16", TF32) == Precision.DEFAULT
