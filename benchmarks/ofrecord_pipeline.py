#!/usr/bin/env python
"""Decoded images/s of flowlab's OFRecord pipeline on ImageNet-style JPEG records, as OneFlow-Benchmark's CNN
programs read them for training (``ofrecord_util.load_imagenet_for_training``): random-crop decode, resize to
224x224, random mirror, normalize to float32 NCHW, labels beside; batch 4.

The records are generated: smooth coloured images with shapes and a little noise (so they compress like photos),
JPEG quality 90, ``encoded`` + ``class/label`` as OneFlow-Benchmark's ``imagenet_ofrecord.py`` writes them.

    ofb_split   OFRecordImageDecoderRandomCrop -> image.Resize(224, 224) -> CropMirrorNormalize(CoinFlip), the
                program's default path (and OneFlow's CPU decoder)
    ofb_fused   OFRecordBytesDecoder -> ImageDecoderRandomCropResize(224, 224) -> CropMirrorNormalize(CoinFlip),
                the program's --gpu_image_decoder path (here: Pillow decoding at a reduced scale where it can)
    serial      the per-record work of ofb_split done in a plain loop in the calling thread, no pipeline: what a
                step would cost if it decoded its own batch

Each is measured for two source sizes: 500x375 (ImageNet's typical photo) and 224x224. A job call does nothing but
take its batch, so the rate is the pipeline's own; ``--workers`` sets the pipeline's decoding threads (default: as
flowlab picks, min(4, cores)).

    python benchmarks/ofrecord_pipeline.py                  # ~1 minute on 2 cores
    python benchmarks/ofrecord_pipeline.py --rounds 5 --workers 1
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flowlab as flow  # noqa: E402
import flowlab.typing as tp  # noqa: E402
from flowlab.data import images, pipeline  # noqa: E402
from flowlab.data.ofrecord import encode_jpeg, read_records, single_bytes, write_dataset  # noqa: E402

MEAN, STD = [123.68, 116.779, 103.939], [58.393, 57.12, 57.375]
BATCH = 4


def photo_like(rng, h, w):
    """A smooth image with a few shapes and mild noise: JPEG sizes and decode times close to a photo's."""
    y, x = np.mgrid[:h, :w].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / rng.uniform(20, 80) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(20, 80)),
                     128 + 90 * np.cos((x + y) / rng.uniform(30, 90)),
                     128 + 80 * np.sin(y / rng.uniform(15, 60) + rng.uniform(0, 6))], axis=2)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(10, min(h, w) / 3)
        base[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def make_dataset(directory, n, h, w, seed=0):
    rng = np.random.default_rng(seed)
    write_dataset(directory, ({"encoded": encode_jpeg(photo_like(rng, h, w), quality=90),
                               "class/label": np.int32(i % 1000)} for i in range(n)),
                  part_num=4, part_name_suffix_length=5)
    sizes = [os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)]
    return sum(sizes) / n


def make_job(directory, fused):
    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(directory, batch_size=BATCH, data_part_num=4, part_name_suffix_length=5,
                                      random_shuffle=True, shuffle_after_epoch=True)
        label = flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)
        if fused:
            encoded = flow.data.OFRecordBytesDecoder(r, "encoded")
            image = flow.data.ImageDecoderRandomCropResize(encoded, target_width=224, target_height=224)
        else:
            image = flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB")
            image = flow.image.Resize(image, target_size=[224, 224])[0]
        coin = flow.random.CoinFlip(batch_size=BATCH)
        normal = flow.image.CropMirrorNormalize(image, mirror_blob=coin, color_space="RGB", output_layout="NCHW",
                                                mean=MEAN, std=STD, output_dtype=flow.float)
        return label, normal
    return job


def warm(job):
    label, normal = job()                       # trace, start the thread, fill its queue
    assert normal.shape == (BATCH, 3, 224, 224) and normal.dtype == np.float32 and label.shape == (BATCH,)


def rate_of_job(job, seconds):
    for _ in range(pipeline.PREFETCH + 1):
        job()                                   # what was prepared ahead while idle: the steady rate follows
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        job()
        count += BATCH
    return count / (time.perf_counter() - start)


def rate_serial(directory, seconds):
    """ofb_split's per-record work in this thread, no pipeline."""
    records = list(read_records(directory))
    crop = images.RandomCropWindow()
    rng = np.random.default_rng(0)
    table = images.normalize_table(MEAN, np.float32(1) / np.float32(STD))
    count, start, k = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        rec = records[k % len(records)]
        k += 1
        img = images.decode(single_bytes(rec, "encoded"), "RGB", lambda h, w: crop(h, w, rng))
        img = images.resize(img, 224, 224)
        images.crop_mirror_normalize(img, 224, 224, 0.5, 0.5, table, "NCHW", bool(rng.integers(2)))
        count += 1
    return count / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per case and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (cases rotate their order); medians shown")
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="decoding threads (default: flowlab's choice)")
    args = parser.parse_args()
    if args.workers is not None:
        pipeline.WORKERS = args.workers
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"Python {platform.python_version()}, NumPy {np.__version__}, Pillow {__import__('PIL').__version__}; "
          f"pipeline workers {pipeline.WORKERS}, prefetch {pipeline.PREFETCH} batches, batch {BATCH}; "
          f"{args.rounds} rounds of {args.seconds:g} s")
    with tempfile.TemporaryDirectory() as tmp:
        cases, kib = [], {}
        for h, w in [(375, 500), (224, 224)]:
            source = f"{w}x{h}"
            directory = os.path.join(tmp, source)
            kib[source] = make_dataset(directory, args.records, h, w) / 1024
            for case in ("ofb_split", "ofb_fused"):
                job = make_job(directory, case == "ofb_fused")
                warm(job)
                cases.append((source, case, lambda job=job: rate_of_job(job, args.seconds)))
            cases.append((source, "serial", lambda directory=directory: rate_serial(directory, args.seconds)))
        rates = {(source, case): [] for source, case, _ in cases}
        for r in range(args.rounds):
            for source, case, measure in cases[r % len(cases):] + cases[:r % len(cases)]:
                rates[(source, case)].append(measure())
        flow.clear_default_session()
    print(f"{'source':>9} {'KiB/jpeg':>9} {'case':>10} {'images/s':>9} {'min-max':>13} {'ms/image':>9}")
    for (source, case), values in rates.items():
        median = float(np.median(values))
        print(f"{source:>9} {kib[source]:9.1f} {case:>10} {median:9.1f} {min(values):6.0f}-{max(values):<6.0f} "
              f"{1000 / median:9.2f}")


if __name__ == "__main__":
    main()
