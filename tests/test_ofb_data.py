"""OneFlow-Benchmark's CNN data loading (``Classification/cnns/ofrecord_util.py``) run unchanged with flowlab as
``oneflow``, on a small generated ImageNet-style OFRecord set (``encoded`` JPEG + ``class/label`` int32, part files
``part-00000`` …, as the benchmark's ``imagenet_ofrecord.py`` writes them). Skipped where the benchmark's sources
are not unpacked (they are read, never copied into flowlab)."""
import argparse
import importlib.util
import os
import sys

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.data.ofrecord import encode_jpeg, write_dataset

OFB_UTIL = "/tmp/ofb/Classification/cnns/ofrecord_util.py"
SIZE = 32
MEAN, STD = [123.68, 116.779, 103.939], [58.393, 57.12, 57.375]


@pytest.fixture
def ofrecord_util(monkeypatch):
    if not os.path.exists(OFB_UTIL):
        pytest.skip("OneFlow-Benchmark's sources are not unpacked at /tmp/ofb")
    monkeypatch.setitem(sys.modules, "oneflow", flow)
    spec = importlib.util.spec_from_file_location("ofb_ofrecord_util", OFB_UTIL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def imagenet_like(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for i in range(12):
        h, w = int(rng.integers(40, 60)), int(rng.integers(40, 60))
        img = np.zeros((h, w, 3), np.uint8) + np.array([(200, 30, 30), (30, 200, 30), (30, 30, 200)][i % 3],
                                                       np.uint8)
        records.append({"encoded": encode_jpeg(img), "class/label": np.int32(i % 3)})
    write_dataset(tmp_path / "train", records, part_num=2, part_name_suffix_length=5)
    write_dataset(tmp_path / "val", records, part_num=2, part_name_suffix_length=5)
    return tmp_path


def _args(d, **kw):
    args = dict(image_size=SIZE, resize_shorter=36, num_nodes=1, gpu_num_per_node=1, batch_size_per_device=4,
                val_batch_size_per_device=4, channel_last=False, train_data_dir=str(d / "train"),
                train_data_part_num=2, val_data_dir=str(d / "val"), val_data_part_num=2, rgb_mean=MEAN,
                rgb_std=STD, gpu_image_decoder=False)
    args.update(kw)
    return argparse.Namespace(**args)


def _check_batch(labels, images, layout="NCHW"):
    assert labels.shape == (4,) and labels.dtype == np.int32
    assert images.dtype == np.float32
    assert images.shape == ((4, 3, SIZE, SIZE) if layout == "NCHW" else (4, SIZE, SIZE, 3))
    rgb = images.mean(axis=(2, 3) if layout == "NCHW" else (1, 2)) * np.float32(STD) + np.float32(MEAN)
    assert (rgb.argmax(axis=1) == labels).all()         # RGB order, and each image with its own label


@pytest.mark.parametrize("channel_last, gpu_image_decoder", [(False, False), (True, False), (False, True)])
def test_load_imagenet_for_training(ofrecord_util, imagenet_like, channel_last, gpu_image_decoder):
    args = _args(imagenet_like, channel_last=channel_last, gpu_image_decoder=gpu_image_decoder)
    if gpu_image_decoder:
        args.image_size = 224       # that path's decoder resizes to 224x224 itself

    @flow.global_function()
    def io_test() -> tp.Numpy:
        return ofrecord_util.load_imagenet_for_training(args)

    for _ in range(4):
        labels, images = io_test()
        if gpu_image_decoder:
            assert images.shape == (4, 3, 224, 224)
            rgb = images.mean(axis=(2, 3)) * np.float32(STD) + np.float32(MEAN)
            assert (rgb.argmax(axis=1) == labels).all()
        else:
            _check_batch(labels, images, "NHWC" if channel_last else "NCHW")


def test_load_imagenet_for_validation(ofrecord_util, imagenet_like):
    args = _args(imagenet_like)

    @flow.global_function()
    def val() -> tp.Numpy:
        return ofrecord_util.load_imagenet_for_validation(args)

    seen = []
    for _ in range(3):
        labels, images = val()
        _check_batch(labels, images)
        seen.extend(labels.tolist())
    assert seen == [0, 2, 1, 0, 2, 1, 1, 0, 2, 1, 0, 2]      # in file order, part-00000 then part-00001


def test_load_synthetic_and_legacy_load_imagenet(ofrecord_util, imagenet_like):
    args = _args(imagenet_like)

    @flow.global_function()
    def synthetic() -> tp.Numpy:
        return ofrecord_util.load_synthetic(args)

    labels, images = synthetic()
    assert labels.shape == (4,) and not labels.any() and images.shape == (4, 3, SIZE, SIZE)

    @flow.global_function()
    def legacy() -> tp.Numpy:
        codec = flow.data.ImageCodec([flow.data.ImageResizePreprocessor(SIZE, SIZE)])
        return ofrecord_util.load_imagenet(args, 4, args.train_data_dir, 2, codec)

    labels, images = legacy()
    assert images.shape == (4, SIZE, SIZE, 3) and labels.dtype == np.int32
    # BGR images normalized with the reversed RGB mean/std, as the program asks
    bgr = images.mean(axis=(1, 2)) * np.float32(STD[::-1]) + np.float32(MEAN[::-1])
    assert (bgr[:, ::-1].argmax(axis=1) == labels).all()
