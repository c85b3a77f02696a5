"""The shipped DCGAN (``flowlab.examples.dcgan``) and Wide & Deep (``flowlab.examples.wide_deep``) train on NumPy:
the GAN's two jobs each train only their own network, with finite losses that move and a discriminator that learns;
Wide & Deep learns clicks (AUC) with sparse table updates that leave untouched rows as they were, and trains on
two logical devices as on one."""
import numpy as np
import pytest

import flowlab as flow
from flowlab.examples import dcgan, wide_deep
from flowlab.optim.optimizers import IndexedSlicesUpdate
from flowlab.runtime import session

pytestmark = pytest.mark.numpy_backend      # the two-device test runs NumPy devices (threads)


def digits_16(n, seed=0):
    """``n`` of the bundled 8x8 digits doubled to 16x16, in [-1, 1] as DCGAN's images."""
    images, _ = flow.data.digits.load_digits_arrays()
    pick = np.random.default_rng(seed).integers(0, len(images), n)
    big = images[pick].repeat(2, axis=1).repeat(2, axis=2).astype(np.float32) / 8 - 1
    return big[:, None]


def values(prefix):
    return {name: v.numpy().copy() for name, v in session.default().variables.items()
            if name.startswith(prefix) and "-" in name and name.rsplit("-", 1)[1] in ("weight", "bias")}


def test_dcgan_jobs_train_their_own_network_with_finite_moving_losses():
    flow.clear_default_session()
    flow.config.seed(0)
    batch, z_dim = 8, 16
    train_d, train_g = dcgan.train_jobs(batch_size=batch, image_size=16, width=8, z_dim=z_dim, lr=2e-3)
    rng = np.random.default_rng(1)
    real = digits_16(batch)
    z = rng.normal(size=(batch, z_dim)).astype(np.float32)

    d_losses = [float(train_d(z, real)[0].mean())]
    generator, discriminator = values("g_"), values("d_")
    for _ in range(8):                                       # the discriminator alone: it learns to tell them apart
        d_losses.append(float(train_d(z, real)[0].mean()))
    assert all(np.isfinite(d_losses)) and d_losses[-1] < 0.8 * d_losses[0], d_losses
    assert all(np.array_equal(v, values("g_")[k]) for k, v in generator.items())      # g_ frozen in D's job
    assert any(not np.array_equal(v, values("d_")[k]) for k, v in discriminator.items())

    discriminator = values("d_")
    g_losses = []
    for _ in range(6):                                       # the generator alone: it learns to fool it
        g_loss, images = train_g(z)
        g_losses.append(float(g_loss.mean()))
    assert all(np.isfinite(g_losses)) and g_losses[-1] < g_losses[0], g_losses
    assert images.shape == (batch, 1, 16, 16) and np.abs(images).max() <= 1
    assert all(np.array_equal(v, values("d_")[k]) for k, v in discriminator.items())   # d_ frozen in G's job
    assert {n.op.__name__ for n in train_g.graph().nodes} >= {"Conv2dTranspose", "LeakyRelu", "SigmoidCrossEntropy"}

    for _ in range(3):                                       # alternating, as dcgan.py trains
        d_loss = train_d(rng.normal(size=(batch, z_dim)).astype(np.float32), real)[0]
        g_loss = train_g(rng.normal(size=(batch, z_dim)).astype(np.float32))[0]
        assert np.isfinite(d_loss).all() and np.isfinite(g_loss).all()


def test_dcgan_generator_checks_its_image_size():
    flow.clear_default_session()
    with pytest.raises(ValueError, match="image_size must be a positive multiple of 4, got 30"):
        dcgan.train_jobs(batch_size=2, image_size=30)[1](np.zeros((2, dcgan.Z_DIM), np.float32))


SIZES = dict(dense_fields=5, wide_fields=2, deep_fields=6, wide_vocab=20_000, deep_vocab=50_000)


def train_wide_deep(devices=1, steps=150, batch=64, **options):
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    flow.config.seed(0)
    train, predict = wide_deep.jobs(batch, dim=8, hidden=(32,), dropout=0.0, lr=0.01, **SIZES, **options)
    data = wide_deep.synthetic_clicks(steps * batch, **SIZES, seed=1)
    train.compiled()
    flow.train.CheckPoint().init()
    initial = {name: session.default().variables[name].numpy().copy() for name in wide_deep.TABLES}
    losses = [float(train(*(a[i * batch:(i + 1) * batch] for a in data))) for i in range(steps)]
    return train, predict, data, initial, losses


def test_wide_and_deep_learns_clicks_with_sparse_updates():
    train, predict, data, initial, losses = train_wide_deep()
    assert np.isfinite(losses).all() and np.mean(losses[-20:]) < np.mean(losses[:20])
    assert [n.name for n in train.graph().nodes if n.op is IndexedSlicesUpdate] == \
        ["wide_embedding-LazyAdamUpdate", "deep_embedding-LazyAdamUpdate"]
    labels, dense, wide_ids, deep_ids = wide_deep.synthetic_clicks(640, **SIZES, seed=2)      # held out
    scores = np.concatenate([predict(dense[i:i + 64], wide_ids[i:i + 64], deep_ids[i:i + 64])
                             for i in range(0, 640, 64)])
    assert wide_deep.auc(labels, scores) > 0.7
    for name, ids in (("wide_embedding", data[2]), ("deep_embedding", data[3])):
        table = session.default().variables[name].numpy()
        untouched = np.setdiff1d(np.arange(table.shape[0]), ids)
        assert untouched.size > 0.9 * table.shape[0]
        assert np.array_equal(table[untouched], initial[name][untouched])     # bit for bit
        assert not np.array_equal(table[np.unique(ids)], initial[name][np.unique(ids)])


def test_wide_and_deep_trains_on_two_logical_devices_as_on_one():
    one = train_wide_deep(steps=5, optimizer="sgd")
    one_tables = {name: session.default().variables[name].numpy().copy() for name in wide_deep.TABLES}
    two = train_wide_deep(devices=2, steps=5, optimizer="sgd")
    np.testing.assert_allclose(two[4], one[4], rtol=1e-5)
    for name in wide_deep.TABLES:
        np.testing.assert_allclose(session.default().variables[name].numpy(), one_tables[name], rtol=1e-5,
                                   atol=1e-7)
    flow.clear_default_session()


def test_auc_counts_ties_half():
    assert wide_deep.auc([0, 1], [0.1, 0.9]) == 1.0
    assert wide_deep.auc([0, 1, 0, 1], [0.5, 0.5, 0.2, 0.7]) == 0.875
    with pytest.raises(ValueError, match="needs both positive and negative labels"):
        wide_deep.auc([1, 1], [0.2, 0.3])
