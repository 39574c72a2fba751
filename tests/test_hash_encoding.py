"""slax.nn's multiresolution hash encoding (slax/nn/_hash_encoding.py, its fused kernels in
slax/nn/_fused_encoding.py, the rows/weights path of slax/nn/_blend.py) against its plain-JAX twin
(slax/nn/_hash_reference.py): values and derivatives to second order in the tables and the points,
with dense and hashed levels, in 2-D and 3-D, with 1 to 8 features a level; points on the grid's
faces; jit and vmap (over points, over a stack of tables, of directional derivatives too); an
eikonal loss's gradient, which binds the fused primitives alone, its gradient in the points by
``jax.grad`` of ``hash_encode`` and from ``hash_encode_with_jacobian`` (one read of the corners and
one scatter); training behind an MLP with optax; float16 tables (values, both gradients and an
eikonal gradient against the twin at float16's tolerance, and training). The
configuration's rules (the paper's resolutions, dense levels) and the errors are checked against
numbers written out here.

Only the derivative checks depend on the route (they run the Slang kernels' numerics); the rest
run on one device kind."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import run_python

import slax
from slax import nn
from slax.testing import RELATIVE_TOLERANCE, check_grads

TOLERANCE = RELATIVE_TOLERANCE["float32"]
HALF_TOLERANCE = RELATIVE_TOLERANCE["float16"]


def small_config(dimensions: int) -> nn.HashEncodingConfig:
    """Four levels of 64 entries from 2 to 24 cells per axis (2, 4, 10, 24): the coarsest level's
    grid fits its table (dense), the others hash, in 2-D and 3-D; two 3-D levels of 10 and 24 cells
    collide in their tables."""
    return nn.HashEncodingConfig(
        dimensions=dimensions, levels=4, log2_table_size=6, coarsest_resolution=2, finest_resolution=24
    )


def tables_and_points(config: nn.HashEncodingConfig, seed: int, points: int = 16):
    """Tables of unit normal entries (larger than the paper's ±1e-4, so that errors show against
    them) and points uniform in [0, 1]^d."""
    table_key, point_key = jax.random.split(jax.random.key(seed))
    tables = jax.random.normal(table_key, config.table_shape)
    return tables, jax.random.uniform(point_key, (points, config.dimensions))


def relative_error(got, want) -> float:
    """The largest error over the largest magnitude of ``want`` (0 where both are zero)."""
    return float(jnp.max(jnp.abs(got - want)) / max(float(jnp.max(jnp.abs(want))), 1e-30))


def assert_matches_the_twin(config: nn.HashEncodingConfig, seed: int, order: int) -> None:
    """``check_grads`` of the encoding against its plain-JAX twin, in the tables and the points."""
    tables, x = tables_and_points(config, seed)
    report = check_grads(
        functools.partial(nn.hash_encode, config=config),
        functools.partial(nn.hash_encode_reference, config=config),
        tables,
        x,
        order=order,
    )
    report.assert_passed()


# --- the configuration ---------------------------------------------------------------------------


@pytest.mark.one_device_kind
def test_config_defaults_are_the_papers():
    config = nn.HashEncodingConfig()
    # 16^3 .. 64^3 cells fit T = 2^19 (17^3 .. 65^3 vertices, rounded up to multiples of 8); the
    # 9 finer levels hash into T entries each.
    assert config.resolutions[:8] == (16, 20, 25, 32, 40, 50, 64, 80)
    dense = [-(-((r + 1) ** 3) // 8) * 8 for r in config.resolutions[:7]]
    assert config.level_entries == (*dense, *[2**19] * 9)
    assert config.level_offsets == tuple(np.cumsum([0, *config.level_entries[:-1]]))
    assert config.table_shape == (sum(dense) + 9 * 2**19, 2)
    assert config.resolutions[0] == 16 and config.resolutions[-1] == 512
    assert config.growth_factor == pytest.approx(math.exp((math.log(512) - math.log(16)) / 15))
    assert config.output_features == 32


@pytest.mark.one_device_kind
def test_config_resolutions_and_dense_levels():
    config = small_config(2)
    b = math.exp((math.log(24) - math.log(2)) / 3)  # 12^(1/3)
    assert (
        config.resolutions == tuple(math.floor(2 * b**level + 1e-9) for level in range(4)) == (2, 4, 10, 24)
    )
    assert config.dense_levels == (True, True, False, False)  # (r + 1)^2 = 9, 25, 121, 625 against 64
    assert small_config(3).dense_levels == (True, False, False, False)  # 27, 125, ... against 64
    image = nn.HashEncodingConfig(dimensions=2, coarsest_resolution=16, finest_resolution=2048)
    assert image.resolutions[-1] == 2048
    # instant-NGP's image grid: 12 dense levels of at most 561^2 vertices, a third of L * T.
    assert image.dense_levels.count(True) == 12 and image.table_rows == 2761040
    assert config.level_entries == (16, 32, 64, 64) and config.level_offsets == (0, 16, 48, 112)


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"dimensions": 4}, ValueError, "dimensions must be 2 or 3, got 4"),
        ({"levels": 0}, ValueError, "levels must be >= 1, got 0"),
        ({"finest_resolution": 8}, ValueError, "finest_resolution must be >= coarsest_resolution (16)"),
        ({"levels": 1}, ValueError, "coarsest_resolution (16) with one level"),
        ({"log2_table_size": 31}, ValueError, "log2_table_size must be in [1, 30], got 31"),
        ({"levels": 4096, "log2_table_size": 20}, ValueError, "below 2^31"),
        ({"levels": 16.0}, TypeError, "levels must be an int, got float 16.0"),
    ],
)
def test_config_refuses(changes, error, message):
    with pytest.raises(error) as raised:
        nn.HashEncodingConfig(**changes)
    assert message in str(raised.value)


@pytest.mark.one_device_kind
def test_hash_encode_refuses_arguments_that_do_not_fit():
    config = small_config(2)
    tables, x = tables_and_points(config, 0)
    with pytest.raises(
        ValueError, match=r"hash_encode: tables must have shape .* \(176, 2\) .* got \(32, 2\)"
    ):
        nn.hash_encode(tables[:32], x, config)
    with pytest.raises(ValueError, match=r"hash_encode: x must have shape \(\.\.\., 2\) .* got \(16, 3\)"):
        nn.hash_encode(tables, jnp.zeros((16, 3)), config)
    with pytest.raises(TypeError, match="hash_encode: x must be a float32 array, got float16"):
        nn.hash_encode(tables, x.astype(jnp.float16), config)
    with pytest.raises(TypeError, match="config must be a slax.nn.HashEncodingConfig, got dict"):
        nn.hash_encode(tables, x, {"dimensions": 2})
    with pytest.raises(
        ValueError, match=r"hash_encode_with_jacobian: x must have shape \(\.\.\., 2\) .* got \(16, 3\)"
    ):
        nn.hash_encode_with_jacobian(tables, jnp.zeros((16, 3)), config)

    def jacobian_sum(x):
        return jnp.sum(nn.hash_encode_with_jacobian(tables, x, config)[1])

    with pytest.raises(
        NotImplementedError, match="hash_encode_with_jacobian: argument 'x' is not differentiable here"
    ):
        jax.make_jaxpr(jax.grad(jacobian_sum))(x)


@pytest.mark.one_device_kind
@pytest.mark.parametrize("dtype", [np.float64, np.int32, jnp.bfloat16], ids=["float64", "int32", "bfloat16"])
def test_tables_of_other_dtypes_are_refused(dtype):
    config = small_config(2)
    tables, x = tables_and_points(config, 0)
    given = np.dtype(dtype).name
    for encode in (nn.hash_encode, nn.hash_encode_reference, nn.hash_encode_with_jacobian):
        with pytest.raises(
            TypeError, match=rf"{encode.__name__}: tables must be float32 or float16, got {given}"
        ):
            encode(np.asarray(tables).astype(dtype), x, config)
    with pytest.raises(
        TypeError, match=rf"hash_encoding_init: dtype must be float32 or float16, got {given}"
    ):
        nn.hash_encoding_init(jax.random.key(0), config, dtype)
    for encode in (nn.hash_encode, nn.hash_encode_with_jacobian):
        with pytest.raises(
            TypeError,
            match=rf"{encode.__name__}: dtype must be float32 or float16, got {given}; the features'",
        ):
            encode(tables, x, config, dtype=dtype)


@pytest.mark.one_device_kind
def test_init_is_the_papers():
    config = small_config(3)
    tables = nn.hash_encoding_init(jax.random.key(0), config)
    assert tables.shape == config.table_shape and tables.dtype == jnp.float32
    assert 0 < float(jnp.max(jnp.abs(tables))) <= 1e-4
    half = nn.hash_encoding_init(jax.random.key(0), config, jnp.float16)
    assert half.dtype == jnp.float16
    np.testing.assert_array_equal(half, tables.astype(jnp.float16))


# --- values and derivatives ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "dimensions",
    [pytest.param(2, marks=pytest.mark.jax_version), pytest.param(3, marks=pytest.mark.one_device_kind)],
    ids=["2d", "3d"],
)
def test_derivatives_to_second_order_match_the_twin(dimensions):
    """Both routes compile each kernel in 2-D; 3-D's are the same Slang with one more axis, checked
    on one route."""
    assert_matches_the_twin(small_config(dimensions), dimensions, order=2)


# one route: the fused kernels are Slang generics over the tables' type, run on every route at float
# in test_derivatives_to_second_order_match_the_twin
@pytest.mark.one_device_kind
def test_float16_tables_match_the_twin():
    """float16 tables: the features (float16), and the gradients in the tables (float16) and in the
    points (float32) of a random float16 cotangent, against the twin, which reads them alike
    (gathered, summed in float32, rounded once), at float16's tolerance. The points crowd a few
    cells and the cotangent is positive, as a loss's often is, so that a coarse entry's gradient
    sums about a thousand shares: added in float16, the tables' gradient would be ~5% off."""
    config = small_config(2)
    tables, x = tables_and_points(config, 7, points=4096)
    tables, x = tables.astype(jnp.float16), 0.3 * x
    shape = (x.shape[0], config.output_features)
    cotangent = jax.random.uniform(jax.random.key(8), shape, jnp.float16, minval=0.5, maxval=1.0)
    got, pullback = jax.vjp(functools.partial(nn.hash_encode, config=config), tables, x)
    want, pullback_reference = jax.vjp(functools.partial(nn.hash_encode_reference, config=config), tables, x)
    assert got.dtype == jnp.float16
    assert relative_error(got.astype(jnp.float32), want.astype(jnp.float32)) < HALF_TOLERANCE
    grads, grads_reference = pullback(cotangent), pullback_reference(cotangent)
    for got_grad, want_grad, dtype in zip(grads, grads_reference, (jnp.float16, jnp.float32), strict=True):
        assert got_grad.dtype == dtype
        assert relative_error(got_grad.astype(jnp.float32), want_grad.astype(jnp.float32)) < HALF_TOLERANCE


@pytest.mark.one_device_kind
@pytest.mark.parametrize("vmapped", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["jit", "vmap"])
def test_float16_features_of_float32_tables_match_the_twin(vmapped):
    """``dtype=jnp.float16`` from float32 tables (a float16 network's input): the features, their
    gradients in the tables (float32) and the points of a float16 cotangent, the JVP in both, and
    an eikonal loss's gradient in the tables (the slope kernels and the point gradient with a
    float16 cotangent), under ``jit`` (with ``vmapped``, and ``vmap`` over the points); and
    ``hash_encode_with_jacobian``'s features, Jacobian, JVP and a loss's gradient in the tables;
    against the twin's float32 features cast to float16, at float16's tolerance."""
    config = small_config(3)
    tables, x = tables_and_points(config, 21, points=64)
    direction = jax.random.normal(jax.random.key(22), x.shape)
    tangent = jax.random.normal(jax.random.key(23), tables.shape)
    cotangent = jax.random.uniform(jax.random.key(24), (64, config.output_features), jnp.float16, 0.5, 1.0)

    def half(encode):
        return lambda tables, x: encode(tables, x, config).astype(jnp.float16)

    got_encode = functools.partial(nn.hash_encode, config=config, dtype=jnp.float16)
    want_encode = half(nn.hash_encode_reference)

    def eikonal(encode):
        def loss(tables):
            gradient = jax.grad(lambda x: jnp.sum(encode(tables, x).astype(jnp.float32) ** 2))(x)
            _, slope = jax.jvp(lambda x: encode(tables, x), (x,), (direction,))
            return jnp.mean(gradient**2) + jnp.mean(slope.astype(jnp.float32) ** 2)

        return jax.grad(loss)

    def outputs(encode, mapped):
        values, pullback = jax.vjp(mapped(encode), tables, x)
        _, jvp = jax.jvp(mapped(encode), (tables, x), (tangent, direction))
        return values, *pullback(cotangent), jvp, eikonal(encode)(tables)

    def over_points(encode):
        return jax.vmap(encode, in_axes=(None, 0))

    want = outputs(want_encode, lambda f: f)
    mapped = over_points if vmapped else (lambda f: f)
    got = jax.jit(functools.partial(outputs, mapped=mapped), static_argnums=0)(got_encode)
    for got_leaf, want_leaf in zip(got, want, strict=True):
        assert got_leaf.dtype == want_leaf.dtype
        assert relative_error(got_leaf.astype(jnp.float32), want_leaf.astype(jnp.float32)) < HALF_TOLERANCE
    assert got[0].dtype == jnp.float16 and got[1].dtype == jnp.float32

    # hash_encode_with_jacobian: float16 features, the Jacobian float32 (the tables'); its loss's
    # gradient takes the scatter's float16 and float32 cotangents together.
    def jacobian_outputs(encode):
        def loss(tables):
            features, jacobian = encode(tables, x)
            values = features.astype(jnp.float32)
            return jnp.sum(jnp.sin(values)) + jnp.sum((jacobian * jnp.cos(values)[..., None]) ** 2)

        _, tangents = jax.jvp(lambda tables: encode(tables, x), (tables,), (tangent,))
        return *encode(tables, x), *tangents, *jax.value_and_grad(loss)(tables)

    def twin(tables, x):
        features, jacobian = with_jacobian_reference(tables, x, config)
        return features.astype(jnp.float16), jacobian

    with_jacobian = functools.partial(nn.hash_encode_with_jacobian, config=config, dtype=jnp.float16)

    def chunked(tables, x):  # vmap over two halves of the points
        both = jax.vmap(with_jacobian, in_axes=(None, 0))(tables, x.reshape(2, -1, x.shape[-1]))
        return tuple(value.reshape(x.shape[0], *value.shape[2:]) for value in both)

    want = jacobian_outputs(twin)
    got = jax.jit(jacobian_outputs, static_argnums=0)(chunked if vmapped else with_jacobian)
    for got_leaf, want_leaf in zip(got, want, strict=True):
        assert got_leaf.dtype == want_leaf.dtype
        assert relative_error(got_leaf.astype(jnp.float32), want_leaf.astype(jnp.float32)) < HALF_TOLERANCE
    assert got[0].dtype == jnp.float16 and got[1].dtype == jnp.float32


@pytest.mark.one_device_kind
@pytest.mark.parametrize("features", [1, pytest.param(3, marks=pytest.mark.slow), 8])  # --quick: the ends
def test_every_feature_count_matches_the_twin(features):
    """Feature counts other than the default 2 (a corner's features read as one Slang vector, and
    8 as two of 4, which covers a whole vector of 4): value and first derivatives in the tables and
    points against the twin. Each count compiles every kernel again, so three stand for the rest."""
    assert_matches_the_twin(
        dataclasses.replace(small_config(2), features_per_level=features), features, order=1
    )


@pytest.mark.one_device_kind
def test_points_on_the_grids_faces_read_inside_the_tables():
    """A coordinate of exactly 1 lies in the last cell with weight 1 on its far corner: the
    encoding there is the table entry of the grid's last vertex (with every index checked)."""
    config = small_config(2)
    tables, _ = tables_and_points(config, 1)
    x = jnp.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 1.0]])
    with slax.config.override(debug_bounds=True):
        got = nn.hash_encode(tables, x, config)
    np.testing.assert_allclose(got, nn.hash_encode_reference(tables, x, config), rtol=TOLERANCE, atol=0)
    for level, resolution in enumerate(config.resolutions):
        if config.dense_levels[level]:
            last = (resolution + 1) ** 2 - 1
        else:
            last = (resolution ^ (resolution * 2654435761)) % config.table_size
        features = slice(2 * level, 2 * level + 2)
        first = config.level_offsets[level]
        np.testing.assert_allclose(got[0, features], tables[first + last], rtol=TOLERANCE)
        np.testing.assert_allclose(got[1, features], tables[first], rtol=TOLERANCE)


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_jit_and_vmap_over_points_and_over_tables():
    config = small_config(3)
    tables, x = tables_and_points(config, 2, points=12)
    encode = functools.partial(nn.hash_encode, config=config)
    want = nn.hash_encode_reference(tables, x, config)
    np.testing.assert_allclose(jax.jit(encode)(tables, x), want, rtol=TOLERANCE, atol=1e-6)
    batched = jax.vmap(encode, in_axes=(None, 1), out_axes=1)(tables, x.reshape(3, 4, 3))
    np.testing.assert_allclose(batched, want.reshape(3, 4, -1), rtol=TOLERANCE, atol=1e-6)

    stack = jnp.stack([tables, 2.0 * tables[::-1]])

    def loss(tables, x):
        return jnp.sum(jnp.sin(encode(tables, x)))

    def loss_reference(tables, x):
        return jnp.sum(jnp.sin(nn.hash_encode_reference(tables, x, config)))

    # Per-example gradients in a stack of tables: each example's scatter adds into its own table.
    got = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None)))(stack, x)
    want = jnp.stack([jax.grad(loss_reference)(t, x) for t in stack])
    assert relative_error(got, want) < TOLERANCE


def with_jacobian_reference(tables, x, config):
    """The twin's features and their Jacobian in the points by ``jax.jacfwd``, laid out as
    ``hash_encode_with_jacobian``'s: ``(n, levels * F)`` and ``(n, levels * F, d)``."""
    encode = functools.partial(nn.hash_encode_reference, tables, config=config)
    return encode(x), jax.vmap(jax.jacfwd(encode))(x)


def features_and_slopes(encoded):
    """A function of the features and the Jacobian nonlinear in both and mixing them, so that its
    second derivatives in the tables take both cotangents of the scatter at once."""
    features, jacobian = encoded
    return jnp.sin(features), jacobian * jnp.cos(features)[..., None]


@pytest.mark.parametrize(
    ("dimensions", "features"),
    [pytest.param(2, 1), pytest.param(3, 8, marks=pytest.mark.one_device_kind)],
    ids=["2d-1", "3d-8"],
)
def test_jacobian_matches_the_twins_jacfwd(dimensions, features):
    """``hash_encode_with_jacobian``'s features and Jacobian (the kernel writes the Jacobian a
    level's ``(d, F)``, returned transposed; 8 features read as two chunks of 4) against the twin's
    ``jax.jacfwd``; a nonlinear function of both to second order in the tables (``check_grads``:
    the two primitives' JVPs and transposes, the scatter's two cotangents); and per-example
    gradients in a stack of tables."""
    config = dataclasses.replace(small_config(dimensions), features_per_level=features)
    tables, x = tables_and_points(config, 20 + features)
    got = nn.hash_encode_with_jacobian(tables, x, config)
    want = with_jacobian_reference(tables, x, config)
    for got_leaf, want_leaf in zip(got, want, strict=True):
        assert got_leaf.shape == want_leaf.shape
        assert relative_error(got_leaf, want_leaf) < TOLERANCE

    report = check_grads(
        lambda tables: features_and_slopes(nn.hash_encode_with_jacobian(tables, x, config)),
        lambda tables: features_and_slopes(with_jacobian_reference(tables, x, config)),
        tables,
        order=2,
    )
    report.assert_passed()

    def loss(encode):
        def per_table(tables):
            values, slopes = features_and_slopes(encode(tables, x, config))
            return jnp.sum(values) + jnp.sum(slopes**2)

        return per_table

    stack = jnp.stack([tables, -0.5 * tables[::-1]])
    got = jax.jit(jax.vmap(jax.grad(loss(nn.hash_encode_with_jacobian))))(stack)
    want = jnp.stack([jax.grad(loss(with_jacobian_reference))(t) for t in stack])
    assert relative_error(got, want) < TOLERANCE


def through_grad(encode, apply, config):
    """``(params, tables, x) -> (values, gradients in x)`` of the field ``apply(params,
    encode(tables, x))`` (a float32 MLP), its gradient by ``jax.vjp`` in x: differentiated again,
    reverse over reverse through the MLP and the encoding."""

    def field(params, tables, x):
        values, pullback = jax.vjp(lambda x: apply(params, encode(tables, x, config).astype(jnp.float32)), x)
        return values, pullback(jnp.ones_like(values))[0]

    return field


def through_jacobian(apply, config):
    """The same field from ``nn.hash_encode_with_jacobian``: the Jacobian times the MLP's input
    gradient, whose gradient in the tables is one scatter."""

    def field(params, tables, x):
        features, jacobian = nn.hash_encode_with_jacobian(tables, x, config)
        values, pullback = jax.vjp(lambda features: apply(params, features.astype(jnp.float32)), features)
        slopes = pullback(jnp.ones_like(values))[0].astype(jnp.float32)
        return values, jnp.sum(jacobian.astype(jnp.float32) * slopes[..., None], axis=-2)

    return field


def through_field(apply, config):
    """The same field from ``nn.hash_field_with_gradient``, whose gradient in the tables reads the
    Jacobian's cotangent as its two factors."""

    def field(params, tables, x):
        network = lambda params, features: apply(params, features.astype(jnp.float32))  # noqa: E731
        return nn.hash_field_with_gradient(network, params, tables, x, config)

    return field


def eikonal_gradient(field, x):
    """``(params, tables) -> gradients`` of an eikonal loss plus a distance term on ``field`` (one
    of the two above) at points ``x``."""

    def loss(params, tables):
        values, gradient = field(params, tables, x)
        norm = jnp.linalg.norm(gradient, axis=-1)
        return jnp.mean((norm - 1.0) ** 2) + jnp.mean(values**2)

    return jax.grad(loss, argnums=(0, 1))


def assert_fields_match_the_twin(fields, config, params, tables, x, tolerance) -> None:
    """Each of ``fields``' values, gradients in x and eikonal gradients in the MLP and the tables
    (jitted) against the plain-JAX twin's, relative to the largest of each."""

    def outputs(field):
        return lambda params, tables: (field(params, tables, x), eikonal_gradient(field, x)(params, tables))

    want = outputs(through_grad(nn.hash_encode_reference, nn.mlp_apply_reference, config))(params, tables)
    for field in fields:
        got = jax.jit(outputs(field))(params, tables)
        for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert got_leaf.dtype == want_leaf.dtype
            assert relative_error(got_leaf.astype(jnp.float32), want_leaf.astype(jnp.float32)) < tolerance


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_eikonal_gradients_in_the_tables_and_the_network_match_the_twin():
    """The gradient in the tables of a loss on the encoding's derivative along a direction in x
    (forward over reverse), and of an eikonal loss on an MLP behind it, its gradient in x by
    ``jax.grad`` (reverse over reverse) and by ``hash_encode_with_jacobian``: values, gradients in
    x, and the loss's gradients in the MLP and the tables."""
    config = small_config(3)
    tables, x = tables_and_points(config, 3)
    direction = jax.random.normal(jax.random.key(4), x.shape)
    params = nn.mlp_init(jax.random.key(5), (config.output_features, 16, 1), activation="tanh")

    def directional(encode):
        def loss(tables):
            _, slope = jax.jvp(lambda x: encode(tables, x, config), (x,), (direction,))
            return jnp.mean(slope**2)

        return jax.grad(loss)

    got = jax.jit(directional(nn.hash_encode))(tables)
    assert relative_error(got, directional(nn.hash_encode_reference)(tables)) < TOLERANCE

    fields = (
        through_grad(nn.hash_encode, nn.mlp_apply, config),
        through_jacobian(nn.mlp_apply, config),
        through_field(nn.mlp_apply, config),
    )
    assert_fields_match_the_twin(fields, config, params, tables, x, TOLERANCE)


@pytest.mark.one_device_kind
@pytest.mark.parametrize("vmapped", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["jit", "vmap"])
def test_a_field_with_its_gradient_matches_the_twin(vmapped):
    """``hash_field_with_gradient`` behind a ReLU MLP (the Hessian kernel's networks): values,
    gradients in x, and an eikonal loss's gradients in the MLP and the tables, under ``jit`` (with
    ``vmapped``, and ``vmap`` over the points), against the plain-JAX twin."""
    config = small_config(3)
    tables, x = tables_and_points(config, 18)
    params = nn.mlp_init(jax.random.key(19), (config.output_features, 16, 16, 1), activation="relu")
    field = through_field(nn.mlp_apply, config)

    def vmapped_field(params, tables, x):
        both = jax.vmap(field, in_axes=(None, None, 0))(params, tables, x.reshape(2, -1, x.shape[-1]))
        return [value.reshape(-1, value.shape[-1]) for value in both]

    assert_fields_match_the_twin((vmapped_field if vmapped else field,), config, params, tables, x, TOLERANCE)


@pytest.mark.one_device_kind
@pytest.mark.slow
def test_a_field_with_its_gradient_over_a_stack_of_tables_matches_the_twin():
    """Per-example gradients in a stack of tables (``vmap`` over the tables) of an eikonal loss on
    ``hash_field_with_gradient``: each example's scatter adds into its own table."""
    config = small_config(2)
    tables, x = tables_and_points(config, 23, points=33)
    stack = jnp.stack([tables, -0.5 * tables[::-1]])
    params = nn.mlp_init(jax.random.key(24), (config.output_features, 8, 1), activation="relu")

    def per_table(field):
        def loss(tables):
            values, gradient = field(params, tables, x)
            return jnp.mean(values**2) + jnp.mean((jnp.linalg.norm(gradient, axis=-1) - 1.0) ** 2)

        return jax.grad(loss)

    got = jax.jit(jax.vmap(per_table(through_field(nn.mlp_apply, config))))(stack)
    twin = per_table(through_grad(nn.hash_encode_reference, nn.mlp_apply_reference, config))
    want = jnp.stack([twin(t) for t in stack])
    assert relative_error(got, want) < TOLERANCE


@pytest.mark.one_device_kind
def test_a_field_with_its_gradient_refuses_what_it_cannot_do():
    """The derivative in x, and a network of more than one output, are refused by name."""
    config = small_config(2)
    tables, x = tables_and_points(config, 20, points=8)
    params = nn.mlp_init(jax.random.key(21), (config.output_features, 8, 1))

    def gradient_norm(x):
        return jnp.sum(nn.hash_field_with_gradient(nn.mlp_apply, params, tables, x, config)[1] ** 2)

    with pytest.raises(
        NotImplementedError, match="hash_field_with_gradient: argument 'x' is not differentiable"
    ):
        jax.grad(gradient_norm)(x)
    two = nn.mlp_init(jax.random.key(22), (config.output_features, 8, 2))
    with pytest.raises(
        ValueError, match=r"hash_field_with_gradient: apply must give one value a point.* got \(8, 2\)"
    ):
        nn.hash_field_with_gradient(nn.mlp_apply, two, tables, x, config)


def primitive_counts(jaxpr) -> collections.Counter:
    """How many equations bind each primitive in a closed jaxpr, nested jaxprs (jit, custom_jvp)
    included."""
    counts: collections.Counter = collections.Counter()
    for equation in jaxpr.eqns:
        counts[equation.primitive.name] += 1
        for param in equation.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                counts += primitive_counts(getattr(inner, "jaxpr", inner))
    return counts


@pytest.mark.one_device_kind
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    ("route", "primitives"),
    [
        ("grad", {"slax_hash_encode": 2, "slax_hash_scatter": 2, "slax_hash_point_gradient": 1}),
        ("jacobian", {"slax_hash_encode_jacobian": 1, "slax_hash_scatter_jacobian": 1}),
        ("field", {"slax_hash_encode_jacobian": 1}),
    ],
)
def test_an_eikonal_steps_gradient_runs_on_fused_kernels_alone(dtype, route, primitives):
    """The SDF step's gradient (a distance term and an eikonal term, in the tables and the MLP)
    binds the fused primitives only: no corner rows or weights through memory (Slang's
    ``level_corners``, slax/nn/_blend.py's primitives), which only second derivatives in x use.
    With the gradient in x by ``jax.grad``, the tables' gradient takes two scatters (the
    encoding's and its gradient's transposes) beside three reads (the encoding, its slope, its
    gradient in x): five passes over the corners; by ``hash_encode_with_jacobian``, one read and
    one scatter; by ``hash_field_with_gradient`` the same read, and its scatter (``scatter_field``)
    a Slang function that the custom VJP calls, not a primitive of the encoding's."""
    config = small_config(3)
    tables, x = tables_and_points(config, 14)
    params = nn.mlp_init(jax.random.key(15), (config.output_features, 16, 1), activation="relu")
    if route == "grad":
        field = through_grad(nn.hash_encode, nn.mlp_apply, config)
    elif route == "jacobian":
        field = through_jacobian(nn.mlp_apply, config)
    else:
        field = through_field(nn.mlp_apply, config)

    jaxpr = jax.make_jaxpr(eikonal_gradient(field, x))(params, tables.astype(dtype))
    counts = primitive_counts(jaxpr.jaxpr)
    assert {name: count for name, count in counts.items() if "hash" in name or "blend" in name} == primitives
    assert not any("level_corners" in name for name in counts)


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_directional_gradients_over_a_stack_of_tables_match_the_twin():
    """Per-example gradients in a stack of tables of a loss on the encoding's derivative along a
    direction in x, and of its gradient in x: the slope kernels (``encode_slopes``,
    ``scatter_slopes``, ``point_gradient``) reading and adding into each example's own table."""
    config = small_config(2)
    tables, x = tables_and_points(config, 16, points=8)
    stack = jnp.stack([tables, -0.5 * tables[::-1]])
    direction = jax.random.normal(jax.random.key(17), x.shape)

    def loss(encode):
        def per_table(tables):
            _, slope = jax.jvp(lambda x: encode(tables, x, config), (x,), (direction,))
            gradient = jax.grad(lambda x: jnp.sum(jnp.sin(encode(tables, x, config))))(x)
            return jnp.sum(slope**2) + jnp.sum(gradient * direction)

        return per_table

    got = jax.jit(jax.vmap(jax.grad(loss(nn.hash_encode))))(stack)
    want = jnp.stack([jax.grad(loss(nn.hash_encode_reference))(t) for t in stack])
    assert relative_error(got, want) < TOLERANCE


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_float16_eikonal_gradients_match_the_twin():
    """An eikonal loss's gradient in float16 tables and in a float32 MLP fed their features, its
    gradient in x by ``jax.grad`` and by ``hash_encode_with_jacobian`` (also under ``vmap`` over
    the points), against the twin."""
    config = small_config(2)
    tables, x = tables_and_points(config, 12)
    tables = tables.astype(jnp.float16)
    params = nn.mlp_init(jax.random.key(13), (config.output_features, 16, 1), activation="tanh")
    jacobian = through_jacobian(nn.mlp_apply, config)

    def vmapped(params, tables, x):
        both = jax.vmap(jacobian, in_axes=(None, None, 0))(params, tables, x.reshape(2, -1, x.shape[-1]))
        return [value.reshape(-1, value.shape[-1]) for value in both]

    fields = (
        through_grad(nn.hash_encode, nn.mlp_apply, config),
        jacobian,
        vmapped,
        through_field(nn.mlp_apply, config),
    )
    assert_fields_match_the_twin(fields, config, params, tables, x, HALF_TOLERANCE)


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_batch_sharded_steps_match_one_device(cpu_path):
    """Plain jax.jit over points split across two host devices, tables and MLP replicated: the loss,
    its gradient, and an eikonal loss's gradient equal one device's (tests/scripts/hash_sharded.py)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    result = run_python("tests/scripts/hash_sharded.py", env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("batch-sharded loss and gradient: ok", "batch-sharded eikonal gradient: ok"):
        assert line in result.stdout


@pytest.mark.one_device_kind
def test_trains_behind_an_mlp_with_adam_in_a_scan():
    """float32 tables, then float16 ones (a float32 copy that Adam updates, cast in the step, as
    tiny-cuda-nn keeps its optimizers' weights), behind a float32 MLP: the loss falls alike. Adam on
    float16 parameters themselves fails in plain JAX too (optax's eps of 1e-8 is 0 in float16: an
    entry not read yet divides 0 by 0)."""
    config = nn.HashEncodingConfig(
        dimensions=2, levels=4, log2_table_size=8, coarsest_resolution=4, finest_resolution=32
    )
    table_key, mlp_key, data_key = jax.random.split(jax.random.key(6), 3)
    params = {
        "tables": nn.hash_encoding_init(table_key, config),
        "mlp": nn.mlp_init(mlp_key, (config.output_features, 16, 1), activation="relu"),
    }
    optimizer = optax.adam(1e-2)

    def target(x):
        return jnp.sin(12.0 * x[:, :1]) * jnp.cos(9.0 * x[:, 1:])

    def loss(params, x, dtype):
        features = nn.hash_encode(params["tables"].astype(dtype), x, config)
        prediction = nn.mlp_apply(params["mlp"], features.astype(jnp.float32))
        return jnp.mean((prediction - target(x)) ** 2)

    @functools.partial(jax.jit, static_argnums=3)
    def train(params, state, keys, dtype):
        def step(carry, key):
            params, state = carry
            value, grads = jax.value_and_grad(loss)(params, jax.random.uniform(key, (256, 2)), dtype)
            updates, state = optimizer.update(grads, state, params)
            return (optax.apply_updates(params, updates), state), value

        return jax.lax.scan(step, (params, state), keys)

    final = {}
    for dtype in (jnp.float32, jnp.float16):
        (_, _), losses = train(params, optimizer.init(params), jax.random.split(data_key, 60), dtype)
        final[dtype] = float(jnp.mean(losses[-10:]))
        assert final[dtype] < 0.5 * float(jnp.mean(losses[:5]))
    assert final[jnp.float16] < 1.2 * final[jnp.float32]
