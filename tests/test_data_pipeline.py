"""The in-job OFRecord pipeline: each decoder and image op against NumPy/Pillow references, shuffling and epochs,
alignment of outputs, damaged data, the background thread (prefetching, errors, shutdown) and a CNN that learns
from a generated JPEG set."""
import io
import struct
import threading
import time

import numpy as np
import pytest
from PIL import Image

import flowlab as flow
import flowlab.typing as tp
from flowlab.data import images, pipeline
from flowlab.data.ofrecord import OFRecordError, encode_jpeg, write_dataset
from flowlab.errors import TraceError


def png(array):
    out = io.BytesIO()
    Image.fromarray(array[..., 0] if array.shape[2] == 1 else array).save(out, format="PNG")
    return out.getvalue()


def coded_image(h, w, tag):
    """RGB pixels that say where they are: R = y, G = x, B = tag (lossless as PNG)."""
    y, x = np.mgrid[:h, :w]
    return np.stack([y, x, np.full((h, w), tag)], axis=2).astype(np.uint8)


@pytest.fixture
def coded_dataset(tmp_path):
    """12 PNG records of varying size; label i, image coded_image(..., tag=i)."""
    shapes = [(30 + 3 * i, 40 + 5 * (i % 4)) for i in range(12)]
    arrays = [coded_image(h, w, i) for i, (h, w) in enumerate(shapes)]
    records = [{"encoded": png(a), "class/label": np.int32(i), "vec": np.arange(3, dtype=np.float32) + i}
               for i, a in enumerate(arrays)]
    write_dataset(tmp_path / "ds", records, part_num=2)
    return str(tmp_path / "ds"), arrays


def reader(d, batch_size=4, **kw):
    return flow.data.ofrecord_reader(d, batch_size=batch_size, data_part_num=kw.pop("data_part_num", 2), **kw)


# ------------------------------------------------------------------------------------------------ decoders

def test_raw_decoder_batches_wrap_around_epochs(coded_dataset):
    d, _ = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.OFRecordRawDecoder(reader(d, batch_size=5), "class/label", shape=(), dtype=flow.int32)

    order = [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]      # part-0 then part-1 (round-robin writer)
    got = np.concatenate([job() for _ in range(5)])
    assert got.dtype == np.int32 and got.shape == (25,)
    assert got.tolist() == (order * 3)[:25]


def test_raw_decoder_shapes_dtypes_and_padding(tmp_path):
    write_dataset(tmp_path, [{"v": np.arange(6, dtype=np.int64) * (i + 1), "short": np.array([1.5, 2.5])}
                             for i in range(2)])

    @flow.global_function()
    def job():
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=2)
        return (flow.data.OFRecordRawDecoder(r, "v", shape=(2, 3), dtype=flow.float),
                flow.data.OFRecordRawDecoder(r, "short", shape=(4,), dtype=flow.double, auto_zero_padding=True))

    v, short = (b.numpy() for b in job().get())
    assert v.dtype == np.float32 and v.shape == (2, 2, 3)
    np.testing.assert_array_equal(v[1], (np.arange(6) * 2).reshape(2, 3))
    np.testing.assert_array_equal(short, [[1.5, 2.5, 0, 0]] * 2)


@pytest.mark.parametrize("color_space", ["RGB", "BGR", "GRAY"])
def test_image_decoder_color_spaces(coded_dataset, color_space):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        return [flow.data.OFRecordImageDecoder(reader(d), "encoded", color_space=color_space)]

    batch = job()[0]
    assert batch.dtype == object and batch.shape == (4,)
    for img, k in zip(batch, [0, 2, 4, 6]):
        ref = arrays[k]
        if color_space == "BGR":
            ref = ref[:, :, ::-1]
        elif color_space == "GRAY":
            ref = np.asarray(Image.fromarray(ref).convert("L"))[:, :, None]
        assert img.dtype == np.uint8
        np.testing.assert_array_equal(img, ref)


def test_jpeg_gray_is_the_luma_plane(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    data = encode_jpeg(rgb)
    write_dataset(tmp_path, [{"encoded": data}])

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path))
        return [flow.data.OFRecordImageDecoder(r, "encoded", color_space="GRAY")]

    img = job()[0][0]
    ref = Image.open(io.BytesIO(data))
    ref.draft("L", ref.size)
    np.testing.assert_array_equal(img[:, :, 0], np.asarray(ref))
    rgb_decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").convert("L"))
    diff = np.abs(img[:, :, 0].astype(int) - rgb_decoded)     # luma of the clipped RGB: close, not equal
    assert diff.mean() < 0.5 and diff.max() <= 8


def test_random_crop_window_rule():
    window = images.RandomCropWindow(10, (0.08, 1.0), (0.75, 1.333333))
    rng = np.random.default_rng(1)
    for H, W in [(100, 150), (37, 20), (224, 224)]:
        for _ in range(300):
            y, x, h, w = window(H, W, rng)
            assert 0 <= y <= H - h and 0 <= x <= W - w and h >= 1 and w >= 1
            area = h * w / (H * W)
            assert 0.08 * 0.9 <= area <= 1.0 and 0.75 * 0.9 <= w / h <= 1.333333 * 1.1
    # an image too narrow for any allowed window: OneFlow's first fallback, (H, max(1, int(H * max_ratio)))
    assert window(4, 100, rng)[2:] == (4, 5)
    # no attempt fits (area 0.64 at ratio 0.75 is 72 rows high): the widest allowed window (60 x 79), scaled to
    # the largest area 0.64 of the image: sqrt(3840 / 4740) = 0.90007 -> 54 x 71
    class Draws:
        def __init__(self, values):
            self.values = iter(values)

        def uniform(self, lo, hi):
            return next(self.values)

        def integers(self, lo, hi):
            return lo
    fallback = images.RandomCropWindow(1, (0.5, 0.64), (0.75, 1.333333))
    assert fallback(60, 100, Draws([0.64, np.log(0.75)])) == (0, 0, 54, 71)
    # an attempt that fits: w = round(sqrt(3600 * 1.3)) = 68, h = round(sqrt(3600 / 1.3)) = 53
    assert fallback(60, 100, Draws([0.6, np.log(1.3)]))[2:] == (53, 68)


def test_random_crop_decoder_cuts_a_window_of_the_image(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d, batch_size=4)
        return [flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB", seed=3),
                flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)]

    sizes = set()
    for _ in range(3):
        crops, labels = job()
        for crop, label in zip(crops, labels):
            y0, x0 = int(crop[0, 0, 0]), int(crop[0, 0, 1])     # the coded pixels say where the window lies
            h, w = crop.shape[:2]
            np.testing.assert_array_equal(crop, arrays[label][y0:y0 + h, x0:x0 + w])
            sizes.add((h, w))
    assert len(sizes) > 3       # random windows


def test_resize_fixed_against_pillow(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d)
        img = flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB")
        out, scale, size = flow.image.Resize(img, target_size=(20, 16))
        big, _, _ = flow.image.Resize(img, target_size=(64, 48), interpolation_type="bilinear", dtype=flow.float)
        assert size is None
        return [out, scale, big]

    out, scale, big = job()
    assert out.shape == (4, 16, 20, 3) and out.dtype == np.uint8 and big.dtype == np.float32
    for i, k in enumerate([0, 2, 4, 6]):
        src = Image.fromarray(arrays[k])
        np.testing.assert_array_equal(out[i], np.asarray(src.resize((20, 16), Image.BOX)))     # auto: shrinking
        np.testing.assert_array_equal(big[i], np.asarray(src.resize((64, 48), Image.BILINEAR)))
        np.testing.assert_allclose(scale[i], [20 / arrays[k].shape[1], 16 / arrays[k].shape[0]], rtol=1e-6)


def test_area_resize_is_the_block_mean():
    a = np.random.default_rng(0).integers(0, 255, (8, 12, 3), dtype=np.uint8)
    ref = a.reshape(4, 2, 6, 2, 3).astype(np.float64).mean(axis=(1, 3))
    np.testing.assert_array_equal(images.resize(a, 6, 4, "area"), np.floor(ref + 0.5))
    np.testing.assert_array_equal(images.resize(a, 5, 3, "area"), Image.fromarray(a).resize((5, 3), Image.BOX))


def test_keep_aspect_sizes_follow_oneflows_rounding():
    # shorter side to 256: 333x500 -> 256x384 (h x w); as (w, h)
    assert images.keep_aspect_size(333, 500, 256, False) == (384, 256)
    assert images.keep_aspect_size(500, 333, 256, False) == (256, 384)
    # longer side 4 of a 5x8 image: 4 * 0.625 = 2.5 rounds half to even: 2 (C's nearbyint), not 3
    assert images.keep_aspect_size(5, 8, 4, True) == (4, 2)
    # max_size bounds the longer side in "shorter" mode; min_size the shorter side in "longer" mode
    assert images.keep_aspect_size(100, 400, 50, False, max_size=120) == (120, 30)
    assert images.keep_aspect_size(100, 400, 80, True, min_size=30) == (120, 30)


def test_resize_keep_aspect_ratio_outputs(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        img = flow.data.OFRecordImageDecoder(reader(d), "encoded", color_space="RGB")
        out, scale, size = flow.image.Resize(img, target_size=24, keep_aspect_ratio=True, resize_side="shorter")
        return [out, scale, size]

    out, scale, size = job()
    assert size.dtype == np.int32 and scale.dtype == np.float32 and out.dtype == object
    for i, k in enumerate([0, 2, 4, 6]):
        h, w = arrays[k].shape[:2]
        new_w, new_h = images.keep_aspect_size(h, w, 24, False)
        assert min(new_w, new_h) == 24 and out[i].shape == (new_h, new_w, 3)
        assert size[i].tolist() == [new_w, new_h]
        np.testing.assert_allclose(scale[i], [new_w / w, new_h / h], rtol=1e-6)
        np.testing.assert_array_equal(out[i], np.asarray(Image.fromarray(arrays[k]).resize((new_w, new_h),
                                                                                           Image.BOX)))


def cmn_reference(img, ch, cw, py, px, mean, std, layout, mirror):
    H, W = img.shape[:2]
    y0, x0 = int(np.float32(H - ch) * np.float32(py)), int(np.float32(W - cw) * np.float32(px))
    win = img[y0:y0 + ch, x0:x0 + cw].astype(np.float32)
    if mirror:
        win = win[:, ::-1]
    out = (win - np.float32(mean)) / np.float32(std)
    return out.transpose(2, 0, 1) if layout == "NCHW" else out


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_crop_mirror_normalize_on_decoded_images(coded_dataset, layout):
    d, arrays = coded_dataset
    mean, std = [10.0, 20.0, 30.0], [2.0, 4.0, 8.0]

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d)
        img = flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB")
        coin = flow.random.CoinFlip(batch_size=4, seed=5)
        out = flow.image.CropMirrorNormalize(img, mirror_blob=coin, color_space="RGB", output_layout=layout,
                                             crop_h=20, crop_w=25, crop_pos_y=0.3, crop_pos_x=0.7, mean=mean,
                                             std=std)
        return [out, coin, flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)]

    flips = []
    for _ in range(3):
        out, coin, labels = job()
        assert out.shape == ((4, 3, 20, 25) if layout == "NCHW" else (4, 20, 25, 3)) and out.dtype == np.float32
        for o, m, k in zip(out, coin, labels):
            np.testing.assert_allclose(o, cmn_reference(arrays[k], 20, 25, 0.3, 0.7, mean, std, layout, m),
                                       rtol=1e-6)
        flips.extend(coin.tolist())
    assert set(flips) == {0, 1}


def test_crop_mirror_normalize_after_fixed_resize_and_gray(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d)
        img = flow.data.OFRecordImageDecoder(r, "encoded", color_space="GRAY")
        rsz = flow.image.Resize(img, target_size=(16, 12), channels=1)[0]
        full = flow.image.CropMirrorNormalize(rsz, color_space="GRAY", mean=[100.0], std=[50.0])
        clipped = flow.image.CropMirrorNormalize(rsz, color_space="GRAY", crop_h=100, crop_w=8, crop_pos_x=1.0,
                                                 output_layout="NHWC")
        return [rsz, full, clipped]

    rsz, full, clipped = job()
    assert rsz.shape == (4, 12, 16, 1) and full.shape == (4, 1, 12, 16) and clipped.shape == (4, 12, 8, 1)
    np.testing.assert_allclose(full, ((rsz.astype(np.float32) - 100) / 50).transpose(0, 3, 1, 2), rtol=1e-6)
    np.testing.assert_array_equal(clipped, rsz[:, :, 8:].astype(np.float32))


def test_crop_mirror_normalize_in_graph_on_a_placeholder():
    x = np.random.default_rng(0).integers(0, 255, (3, 10, 12, 3), dtype=np.uint8)
    m = np.array([1, 0, 1], np.int8)

    @flow.global_function()
    def job(img: tp.Numpy.Placeholder((3, 10, 12, 3), dtype=flow.uint8),
            mirror: tp.Numpy.Placeholder((3,), dtype=flow.int8)) -> tp.Numpy:
        return flow.image.CropMirrorNormalize(img, mirror_blob=mirror, crop_h=6, crop_w=5, crop_pos_y=0.0,
                                              mean=[1.0, 2.0, 3.0], std=[3.0])

    out = job(x, m)
    for o, img, flag in zip(out, x, m):
        np.testing.assert_allclose(o, cmn_reference(img, 6, 5, 0.0, 0.5, [1, 2, 3], [3.0], "NCHW", flag), rtol=1e-6)


def test_crop_mirror_normalize_argument_errors(coded_dataset):
    d, _ = coded_dataset

    @flow.global_function()
    def job():
        img = flow.data.OFRecordImageDecoder(reader(d), "encoded")
        return flow.image.CropMirrorNormalize(img, mean=[1.0, 2.0])

    with pytest.raises(ValueError, match="mean must have 1 or 3 values"):
        job()

    @flow.global_function()
    def job2():
        img = flow.data.OFRecordImageDecoder(reader(d), "encoded")
        return flow.image.CropMirrorNormalize(img)

    with pytest.raises(ValueError, match="varying size need crop_h and crop_w"):
        job2()


def test_coin_flip_probability_and_seed():
    @flow.global_function()
    def job() -> tp.Numpy:
        return [flow.random.CoinFlip(batch_size=20000, probability=0.8),
                flow.random.CoinFlip(batch_size=50, seed=7), flow.random.CoinFlip(batch_size=50, seed=7)]

    flips, a, b = job()
    assert flips.dtype == np.int8 and set(np.unique(flips)) == {0, 1}
    assert abs(flips.mean() - 0.8) < 0.015
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(job()[1], a)       # new flips every call


def test_decode_random_new_values_every_call():
    @flow.global_function()
    def job() -> tp.Numpy:
        label = flow.data.decode_random(shape=(), dtype=flow.int32, batch_size=6,
                                        initializer=flow.zeros_initializer(flow.int32))
        image = flow.data.decode_random(shape=(3, 4, 4), dtype=flow.float, batch_size=6)
        return [label, image]

    (l1, i1), (l2, i2) = job(), job()
    assert l1.dtype == np.int32 and l1.shape == (6,) and not l1.any()
    assert i1.shape == (6, 3, 4, 4) and i1.dtype == np.float32 and 0 <= i1.min() and i1.max() < 1
    assert not np.array_equal(i1, i2)


# ------------------------------------------------------------------------------------------------ decode_ofrecord

def test_decode_ofrecord_image_and_label(tmp_path):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 255, (12, 10, 3), dtype=np.uint8) for _ in range(4)]
    write_dataset(tmp_path, [{"encoded": png(a), "class/label": np.int32(i)} for i, a in enumerate(arrays)],
                  part_num=1, part_name_suffix_length=5)
    mean, std = [10.0, 20.0, 30.0], [2.0, 3.0, 4.0]

    @flow.global_function()
    def job() -> tp.Numpy:
        codec = flow.data.ImageCodec([flow.data.ImageResizePreprocessor(5, 6)])
        image = flow.data.BlobConf("encoded", shape=(6, 5, 3), dtype=flow.float, codec=codec,
                                   preprocessors=[flow.data.NormByChannelPreprocessor(mean[::-1], std[::-1])])
        rgb = flow.data.BlobConf("encoded", shape=(12, 10, 3), dtype=flow.uint8,
                                 codec=flow.data.ImageCodec([flow.data.ImagePreprocessor("bgr2rgb")]))
        gray = flow.data.BlobConf("encoded", shape=(12, 10, 1), dtype=flow.uint8, codec=flow.data.ImageCodec())
        label = flow.data.BlobConf("class/label", shape=(), dtype=flow.int32, codec=flow.data.RawCodec())
        return list(flow.data.decode_ofrecord(str(tmp_path), (label, image, rgb, gray), batch_size=4,
                                              part_name_suffix_length=5, name="decode"))

    label, image, rgb, gray = job()
    assert label.tolist() == [0, 1, 2, 3] and image.shape == (4, 6, 5, 3) and image.dtype == np.float32
    for i, a in enumerate(arrays):
        bgr = np.asarray(Image.fromarray(a).resize((5, 6), Image.BILINEAR))[:, :, ::-1].astype(np.float64)
        np.testing.assert_allclose(image[i], (bgr - mean[::-1]) / std[::-1], rtol=1e-5)   # BGR unless bgr2rgb
        np.testing.assert_array_equal(rgb[i], a)
        np.testing.assert_array_equal(gray[i][:, :, 0], np.asarray(Image.fromarray(a).convert("L")))
    names = [n.name for n in job.graph().nodes]
    assert names[0] == "decode_reader" and "decode_class_label" in names


def test_decode_ofrecord_shape_mismatch_is_an_error(tmp_path):
    write_dataset(tmp_path, [{"encoded": png(np.zeros((8, 8, 3), np.uint8))}])

    @flow.global_function()
    def job() -> tp.Numpy:
        blob = flow.data.BlobConf("encoded", shape=(4, 4, 3), dtype=flow.float, codec=flow.data.ImageCodec())
        return flow.data.decode_ofrecord(str(tmp_path), [blob])[0]

    with pytest.raises(OFRecordError, match=r"decodes to shape \(8, 8, 3\) .* the blob is \(4, 4, 3\)"):
        job()


# ------------------------------------------------------------------------------------------------ shuffling

def _label_dataset(tmp_path, n=24, parts=3):
    write_dataset(tmp_path, [{"class/label": np.int32(i)} for i in range(n)], part_num=parts)
    return str(tmp_path)


def test_random_shuffle_covers_every_record_once_per_epoch(tmp_path):
    d = _label_dataset(tmp_path)

    def make_job():
        @flow.global_function()
        def job() -> tp.Numpy:
            r = flow.data.ofrecord_reader(d, batch_size=4, data_part_num=3, random_shuffle=True,
                                          shuffle_buffer_size=5)
            return flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)
        return job

    job = make_job()
    epochs = [np.concatenate([job() for _ in range(6)]) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(24))
    assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()
    assert epochs[0].tolist() != sorted(epochs[0].tolist())
    flow.clear_default_session()                # a new run with the same seed reads in the same order
    job = make_job()
    assert np.concatenate([job() for _ in range(6)]).tolist() == epochs[0].tolist()
    flow.clear_default_session()
    seed = flow.runtime.session.default().seed
    flow.config.seed(seed + 1)                  # another seed, another order
    try:
        job = make_job()
        assert np.concatenate([job() for _ in range(6)]).tolist() != epochs[0].tolist()
    finally:
        flow.config.seed(seed)


def test_shuffle_after_epoch_reorders_the_part_files(tmp_path):
    d = _label_dataset(tmp_path, n=24, parts=6)     # part k holds k, k+6, k+12, k+18

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=4, data_part_num=6, shuffle_after_epoch=True)
        return flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)

    first = np.concatenate([job() for _ in range(6)])
    assert first.tolist() == [k + 6 * j for k in range(6) for j in range(4)]       # epoch 0: files in order
    orders = []
    for _ in range(3):
        epoch = np.concatenate([job() for _ in range(6)]).reshape(6, 4)
        assert all((row % 6 == row[0] % 6).all() for row in epoch)      # whole files
        orders.append((epoch[:, 0] % 6).tolist())
        assert sorted(orders[-1]) == list(range(6))
    assert any(o != list(range(6)) for o in orders)


def test_labels_stay_aligned_with_images(tmp_path):
    colors = [(220, 30, 30), (30, 200, 40), (40, 40, 210)]
    rng = np.random.default_rng(0)
    records = []
    for i in range(30):
        c = int(rng.integers(3))
        img = np.zeros((16 + i % 5, 20, 3), np.uint8) + np.array(colors[c], np.uint8)
        records.append({"encoded": encode_jpeg(img), "class/label": np.int32(c), "id": np.int64(i)})
    write_dataset(tmp_path, records, part_num=3)

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=7, data_part_num=3, random_shuffle=True,
                                      shuffle_buffer_size=8, shuffle_after_epoch=True)
        img = flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB")
        img = flow.image.CropMirrorNormalize(flow.image.Resize(img, target_size=(8, 8))[0], color_space="RGB",
                                             mirror_blob=flow.random.CoinFlip(batch_size=7))
        return [flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32), img,
                flow.data.OFRecordRawDecoder(r, "id", shape=(1,), dtype=flow.int64)]

    for _ in range(10):
        labels, imgs, ids = job()
        seen = np.abs(imgs.mean(axis=(2, 3))[:, None, :] - np.array(colors)[None]).sum(axis=2).argmin(axis=1)
        assert seen.tolist() == labels.tolist()
        assert [records[i]["class/label"] for i in ids[:, 0]] == labels.tolist()


# ------------------------------------------------------------------------------------------------ bad input

def test_missing_directory_and_part_files_fail_at_trace_time(tmp_path):
    write_dataset(tmp_path, [{"a": 1}], part_num=2, part_name_suffix_length=3)

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), data_part_num=4, part_name_suffix_length=3)
        return flow.data.OFRecordRawDecoder(r, "a", shape=(), dtype=flow.int64)

    with pytest.raises(FileNotFoundError, match=r"2 of the 4 part file\(s\) are missing .*part-002, part-003 "
                                                r".*holds: part-000, part-001"):
        job()

    @flow.global_function()
    def job2() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path / "nope"))
        return flow.data.OFRecordRawDecoder(r, "a", shape=(), dtype=flow.int64)

    with pytest.raises(FileNotFoundError, match="OFRecord directory .*nope' does not exist"):
        job2()


def _job_on(d, key="class/label", dtype=flow.int32, shape=(), batch_size=2):
    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=batch_size)
        return flow.data.OFRecordRawDecoder(r, key, shape=shape, dtype=dtype)
    return job


def test_truncated_file_fails_on_the_call_that_reaches_it(tmp_path):
    write_dataset(tmp_path, [{"class/label": np.int32(i)} for i in range(5)])
    path = tmp_path / "part-0"
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    offset = 4 * (len(data) // 5)           # every record has the same size: the last one starts here
    job = _job_on(str(tmp_path))
    assert job().tolist() == [0, 1] and job().tolist() == [2, 3]
    with pytest.raises(OFRecordError, match=rf"{path}: damaged or truncated record at byte offset {offset}"):
        job()
    with pytest.raises(OFRecordError):          # the reader stays failed: no garbage, no hang
        job()


@pytest.mark.parametrize("record, kwargs, message", [
    ({"label": np.int32(1)}, {}, r"has no key 'class/label'; keys present: \['label'\]"),
    ({"class/label": 1.5}, {}, "holds a float_list, but dtype int32 was asked for"),
    ({"class/label": np.array([1, 2], np.int32)}, {}, r"holds 2 value\(s\) \(int32_list\), expected 1"),
    ({"class/label": np.int32(1)}, {"shape": (3,)}, r"holds 1 value\(s\) \(int32_list\), expected 3"),
])
def test_record_content_errors_name_file_offset_key_and_keys(tmp_path, record, kwargs, message):
    write_dataset(tmp_path, [{"class/label": np.int32(0)}, record])
    job = _job_on(str(tmp_path), **kwargs)
    with pytest.raises(OFRecordError, match=message) as info:
        job()
    text = str(info.value)
    assert str(tmp_path / "part-0") in text and "byte offset" in text
    if not kwargs:          # the first record is fine: the error names the second one's offset
        size = struct.unpack("<q", (tmp_path / "part-0").read_bytes()[:8])[0]
        assert f"byte offset {8 + size} " in text


def test_a_dataset_without_records_is_an_error_not_a_hang(tmp_path):
    write_dataset(tmp_path, [], part_num=2)
    with pytest.raises(OFRecordError, match="hold no records"):
        _job_on(str(tmp_path))()


def test_undecodable_image_names_record_and_key(tmp_path):
    write_dataset(tmp_path, [{"encoded": b"not an image", "class/label": np.int32(0)}])

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path))
        return [flow.data.OFRecordImageDecoder(r, "encoded")]

    with pytest.raises(OFRecordError, match=r"OFRecordImageDecoder\('encoded'\): record at byte offset 0 of .*"
                                            r"part-0: cannot decode 12 bytes as an image"):
        job()


def test_a_batch_that_does_not_split_over_the_devices_is_named(tmp_path):
    d = _label_dataset(tmp_path)
    flow.config.gpu_device_num(4)
    job = _job_on(d, batch_size=6)
    with pytest.raises(ValueError, match=r"flow.data.ofrecord_reader: batch_size must split evenly over the 4 "
                                         r"devices set by flow.config .*got 6"):
        job()


# ------------------------------------------------------------------------------------------------ the thread

def test_preparation_overlaps_the_step(tmp_path, monkeypatch):
    """A slow decoder (40 ms a batch) and a slow step (40 ms) take ~40 ms a call together, not 80 ms."""
    write_dataset(tmp_path, [{"encoded": png(np.zeros((4, 4, 3), np.uint8))} for _ in range(8)])
    decode = images.decode

    def slow_decode(*args, **kwargs):
        time.sleep(0.04)
        return decode(*args, **kwargs)
    monkeypatch.setattr(images, "decode", slow_decode)
    monkeypatch.setattr(pipeline, "WORKERS", 1)

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=1)
        return [flow.data.OFRecordImageDecoder(r, "encoded")]

    job()                                   # the thread starts and fills its queue
    p = job.graph().nodes[0].attrs["pipeline"]
    deadline = time.perf_counter() + 5
    while p.batches_made < 1 + pipeline.PREFETCH and time.perf_counter() < deadline:
        time.sleep(0.01)
    time.sleep(0.15)
    assert p.batches_made == 1 + pipeline.PREFETCH      # the one taken and PREFETCH ready: then it waits for room
    calls = 10
    start = time.perf_counter()
    for _ in range(calls):
        job()
        time.sleep(0.04)                    # the step's own work
    elapsed = time.perf_counter() - start
    serial = calls * 0.08
    assert elapsed < 0.75 * serial, f"{elapsed:.3f} s for {calls} calls: decoding did not overlap the steps"


def test_clear_default_session_stops_the_thread(tmp_path):
    d = _label_dataset(tmp_path)
    job = _job_on(d)
    job()
    p = job.graph().nodes[0].attrs["pipeline"]
    assert p.running
    deadline = time.monotonic() + 10
    while p._queue.empty() and time.monotonic() < deadline:    # a prefetched batch waits: it is not handed out
        time.sleep(0.01)
    assert not p._queue.empty()
    flow.clear_default_session()
    assert not p.running
    assert not [t for t in threading.enumerate() if t.name.startswith(f"flowlab-data-{p.name}") and t.is_alive()]
    with pytest.raises(RuntimeError, match="stopped"):
        p.next_batch()


def test_a_job_of_data_ops_only_takes_no_arguments(tmp_path):
    d = _label_dataset(tmp_path)
    job = _job_on(d, batch_size=3)
    assert job().tolist() == [0, 3, 6]       # part-0 holds 0, 3, 6 …
    with pytest.raises(Exception, match="takes 0 argument"):
        job(np.zeros(1))


# ------------------------------------------------------------------------------------------------ learning

def _shapes_dataset(directory, n=96, size=32, seed=0):
    """Three classes of coloured shapes on a noisy background: a red disc, a green square, a blue bar."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:size, :size]
    records = []
    for i in range(n):
        c = i % 3
        img = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
        cy, cx, r = rng.integers(10, 22), rng.integers(10, 22), rng.integers(5, 9)
        if c == 0:
            mask = (y - cy) ** 2 + (x - cx) ** 2 <= r * r
        elif c == 1:
            mask = (abs(y - cy) <= r - 1) & (abs(x - cx) <= r - 1)
        else:
            mask = (abs(y - cy) <= 2) & (abs(x - cx) <= r + 3)
        img[mask] = [(230, 40, 40), (40, 220, 40), (40, 40, 230)][c]
        records.append({"encoded": encode_jpeg(img), "class/label": np.int32(c)})
    write_dataset(directory, records, part_num=2)


def test_small_cnn_learns_from_an_ofrecord_jpeg_set(tmp_path):
    _shapes_dataset(tmp_path)
    flow.config.seed(0)

    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=16, data_part_num=2, random_shuffle=True,
                                      shuffle_after_epoch=True)
        label = flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)
        img = flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB")
        x = flow.image.CropMirrorNormalize(img, mirror_blob=flow.random.CoinFlip(batch_size=16), color_space="RGB",
                                           crop_h=28, crop_w=28, mean=[123.0, 117.0, 104.0], std=[58.0, 57.0, 57.0])
        w = flow.get_variable("conv-weight", shape=(8, 3, 5, 5), initializer=flow.random_normal_initializer(0, 0.1))
        h = flow.nn.relu(flow.nn.conv2d(x, w, strides=2, padding="SAME"))
        h = flow.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
        logits = flow.layers.dense(flow.reshape(h, (16, -1)), 3, name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(label, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9).minimize(loss)
        return loss

    losses = [float(train().mean()) for _ in range(60)]
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    assert last < 0.4 * first and last < 0.45, (first, last)


# ------------------------------------------------------------------------------------------------ fused decoder, errors

def test_fused_decoder_draft_matches_a_full_decode(tmp_path):
    from flowlab.data.ops import _decode_crop_resize
    y, x = np.mgrid[:1200, :1600]
    smooth = np.stack([x * 255 // 1600, y * 255 // 1200, (x + y) * 255 // 2800], axis=2).astype(np.uint8)
    data = encode_jpeg(smooth)
    window = lambda h, w, rng: (100, 300, 900, 1000)       # noqa: E731 - a fixed window: y, x, h, w
    out = _decode_crop_resize(data, window, None, 224, 224)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[100:1000, 300:1300]
    ref = np.asarray(Image.fromarray(full).resize((224, 224), Image.BOX))
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - ref).mean() < 1.0 and np.abs(out.astype(int) - ref).max() <= 6


def test_fused_decoder_in_a_job(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d)
        encoded = flow.data.OFRecordBytesDecoder(r, "encoded")
        img = flow.data.ImageDecoderRandomCropResize(encoded, target_width=12, target_height=10, seed=1)
        return [encoded, img, flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)]

    encoded, img, labels = job()
    assert img.shape == (4, 10, 12, 3) and img.dtype == np.uint8
    assert [png(arrays[k]) == bytes(e) for e, k in zip(encoded, labels)] == [True] * 4
    assert (img[..., 2] == labels[:, None, None]).all()      # RGB: the blue channel holds the tag


@pytest.mark.parametrize("call, error, message", [
    (lambda d: flow.data.ofrecord_reader(d, batch_size=0), ValueError, "batch_size must be a positive int"),
    (lambda d: flow.data.OFRecordRawDecoder(flow.random.CoinFlip(), "a", (), flow.int32), TypeError,
     "input_blob must be the output of flow.data.ofrecord_reader, got CoinFlip_0/out_0 made by flow.random.CoinFlip"),
    (lambda d: flow.data.OFRecordImageDecoder(reader(d), "encoded", color_space="HSV"), ValueError,
     "color_space must be one of RGB, BGR, GRAY"),
    (lambda d: flow.image.Resize(flow.data.OFRecordImageDecoder(reader(d), "encoded"), target_size=224), ValueError,
     r"target_size must be \(width, height\)"),
    (lambda d: flow.image.Resize(flow.data.OFRecordRawDecoder(reader(d), "vec", (3,), flow.float), target_size=(4, 4)),
     TypeError, r"image must be decoded uint8 images, got float32\[4, 3\]"),
    (lambda d: flow.image.Resize(flow.random.CoinFlip(batch_size=4), target_size=(4, 4)), TypeError,
     "must be images from a flow.data image decoder"),
    (lambda d: flow.data.OFRecordImageDecoderRandomCrop(reader(d), "encoded", random_area=[0.5, 0.1]), ValueError,
     r"random_area must satisfy 0 < min <= max"),
    (lambda d: flow.image.CropMirrorNormalize(flow.data.OFRecordImageDecoder(reader(d), "encoded"), crop_h=4,
                                              crop_w=4, mirror_blob=flow.random.CoinFlip(batch_size=3)), ValueError,
     r"mirror_blob must be int8 of shape \(4,\)"),
])
def test_argument_errors_at_trace_time(coded_dataset, call, error, message):
    d, _ = coded_dataset

    @flow.global_function()
    def job():
        return call(d)

    with pytest.raises(error, match=message):
        job()


def test_image_decode_random_crop_and_target_resize(coded_dataset):
    d, arrays = coded_dataset

    @flow.global_function()
    def job() -> tp.Numpy:
        r = reader(d)
        img = flow.image.decode(flow.data.OFRecordBytesDecoder(r, "encoded"), color_space="RGB")
        crop = flow.image.random_crop(img, random_area=[0.3, 0.5], seed=2)
        out, size, scale = flow.image.target_resize(img, target_size=20, max_size=25)
        return [img, crop, out, size, scale, flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)]

    img, crop, out, size, scale, labels = job()
    for i, k in enumerate(labels):
        np.testing.assert_array_equal(img[i], arrays[k])
        y0, x0 = int(crop[i][0, 0, 0]), int(crop[i][0, 0, 1])
        h, w = crop[i].shape[:2]
        np.testing.assert_array_equal(crop[i], arrays[k][y0:y0 + h, x0:x0 + w])
        assert 0.3 * 0.9 <= h * w / arrays[k][..., 0].size <= 0.5 * 1.1
        new_w, new_h = images.keep_aspect_size(*arrays[k].shape[:2], 20, False, max_size=25)
        assert out[i].shape == (new_h, new_w, 3) and size[i].tolist() == [new_w, new_h] and max(new_w, new_h) <= 25
        np.testing.assert_allclose(scale[i], [new_w / arrays[k].shape[1], new_h / arrays[k].shape[0]], rtol=1e-6)


def test_a_reader_of_another_job_is_refused_before_it_changes(coded_dataset):
    d, _ = coded_dataset
    held = {}

    @flow.global_function()
    def first() -> tp.Numpy:
        held["reader"] = reader(d)
        return flow.data.OFRecordRawDecoder(held["reader"], "class/label", shape=(), dtype=flow.int32)

    @flow.global_function()
    def second() -> tp.Numpy:
        return flow.data.OFRecordRawDecoder(held["reader"], "vec", shape=(3,), dtype=flow.float)

    first()
    with pytest.raises(TraceError, match="belongs to job 'first', not to job 'second'"):
        second()
    assert len(held["reader"].node.attrs["pipeline"].fields) == 1
    assert first().tolist() == [8, 10, 1, 3]
