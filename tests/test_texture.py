"""The bilinear texture sampler of experiments/texture.py: shaders/texture.slang's
``sample_bilinear``, which reads its texture as SlangPy's ``IDiffTensor<float4, 2>``, against its
plain-JAX twin ``bilinear_reference``, in values and in the gradient with respect to the texture
(Slang's bwd_diff adding into the texture's gradient buffer atomically, JAX's scatter-add); and the
twin itself against the convention both implement."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import texture

import slax
from slax.testing import RELATIVE_TOLERANCE

TOLERANCE = RELATIVE_TOLERANCE["float32"]


@pytest.fixture(scope="module")
def module():
    return slax.load_module("texture")


def _texture_and_uv(rng, height=7, width=5, samples=256):
    """A random (height, width, 4) RGBA texture (not square, so that swapped axes show) and random
    uv in [0, 1]^2, the four corners among them (where the edges clamp)."""
    image = rng.uniform(-1.0, 1.0, (height, width, 4)).astype(np.float32)
    uv = rng.uniform(0.0, 1.0, (samples, 2)).astype(np.float32)
    uv[:4] = [[0, 0], [1, 0], [0, 1], [1, 1]]
    return jnp.asarray(image), jnp.asarray(uv)


def test_slang_sampler_matches_the_jax_twin(module, rng):
    image, uv = _texture_and_uv(rng)
    got = module.sample_bilinear(image, uv)
    want = texture.bilinear_reference(image, uv)
    assert got.shape == (uv.shape[0], 4)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)


def test_gradient_with_respect_to_the_texture_matches_the_jax_twin(module, rng):
    """Under jax.jit, a random cotangent per sample: every texel's gradient is the sum over the
    samples that read it (many samples per texel: 256 over 35 texels)."""
    image, uv = _texture_and_uv(rng)
    cotangent = jnp.asarray(rng.uniform(-1.0, 1.0, (uv.shape[0], 4)).astype(np.float32))

    def pulled_back(sample):
        return jax.jit(lambda image: jax.vjp(lambda t: sample(t, uv), image)[1](cotangent)[0])(image)

    got = pulled_back(module.sample_bilinear)
    want = pulled_back(texture.bilinear_reference)
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * scale)


def test_training_loss_gradient_matches_the_jax_twin(module, rng):
    """The experiment's loss and its gradient, as one training step computes them."""
    image, uv = _texture_and_uv(rng, samples=512)
    target = texture.bilinear_reference(image[::-1] * 0.5, uv)
    loss_slax, grad_slax = texture.loss_and_grad(module.sample_bilinear)(image, uv, target)
    loss_jax, grad_jax = texture.loss_and_grad(texture.bilinear_reference)(image, uv, target)
    np.testing.assert_allclose(loss_slax, loss_jax, rtol=TOLERANCE)
    np.testing.assert_allclose(
        grad_slax, grad_jax, rtol=TOLERANCE, atol=TOLERANCE * float(jnp.abs(grad_jax).max())
    )


@pytest.mark.one_device_kind
def test_jax_twin_samples_texel_centres_blends_between_them_and_clamps_at_the_edges(rng):
    """Texel (y, x) sits at uv ((x + 0.5) / W, (y + 0.5) / H); halfway between two centres the
    sample is their mean; nearer the border than the outermost centres it is the edge texel."""
    image, _ = _texture_and_uv(rng)
    height, width = image.shape[:2]
    y, x = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    centres = np.stack([(x.ravel() + 0.5) / width, (y.ravel() + 0.5) / height], axis=-1)
    np.testing.assert_allclose(
        texture.bilinear_reference(image, jnp.asarray(centres, jnp.float32)), image.reshape(-1, 4), atol=1e-6
    )
    between = jnp.asarray([[2.0 / width, 3.5 / height]])  # columns 1 and 2 of row 3, halfway
    np.testing.assert_allclose(
        texture.bilinear_reference(image, between)[0], (image[3, 1] + image[3, 2]) / 2, atol=1e-6
    )
    corners = jnp.asarray([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.1 / width, 1.0 - 0.2 / height]])
    np.testing.assert_allclose(
        texture.bilinear_reference(image, corners),
        np.stack([image[0, 0], image[0, -1], image[-1, 0], image[-1, -1], image[-1, 0]]),
        atol=1e-6,
    )
