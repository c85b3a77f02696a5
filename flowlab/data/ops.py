"""OneFlow 0.x's in-job data ops: ``flow.data.ofrecord_reader`` and its decoders, ``flow.image.Resize`` /
``CropMirrorNormalize`` / ``decode`` / ``random_crop`` / ``target_resize``, ``flow.random.CoinFlip``,
``flow.data.decode_random`` and the older ``flow.data.decode_ofrecord`` with its ``BlobConf`` / codecs /
preprocessors.

How they run (``flowlab.data.pipeline``): ``ofrecord_reader`` makes a graph node whose output is the call's batch
of records, an opaque value of shape ``(batch_size,)``. Each decoder or image op on it registers its per-record
work with the reader's ``Pipeline`` while the job is traced; its graph node only picks its prepared values out of
the batch the reader node pulled for this call. Outputs of fixed shape are arrays ``(batch_size, ...)``; decoded
images of varying size are lists (object arrays of shape ``(batch_size,)``, OneFlow's tensor buffers), which only
the ``flow.image`` ops take. Every registered op runs for every batch, even one whose output the job never uses.
On n devices (``flow.config.gpu_device_num(n)``) a reader, a seeded ``CoinFlip`` and ``decode_random`` make one
whole batch a call, and each device takes its rows (``runtime.devices.BatchShares``): under the consistent view
``batch_size`` is the logical batch, each device gets ``batch_size / n`` (OneFlow's rule; it must divide evenly);
under the mirrored view each device gets ``batch_size`` of its own. n devices so read the very records one device
reads, in the same order (OneFlow instead hands each device its own part files).

``CropMirrorNormalize``'s mirror flags (``flow.random.CoinFlip``, a tensor of the job) are applied in the graph, on
the cropped and normalized batch: the rest of its work is done ahead, on the pipeline's thread.
"""
from __future__ import annotations

import functools
import io
import math
import numbers
import zlib

import numpy as np
from PIL import Image

from .. import graph as g
from ..dtypes import as_dtype
from ..errors import ShapeError, TraceError
from ..initializers import Initializer, random_uniform_initializer
from ..ops import Op, apply, spec
from ..runtime import session
from ..runtime.devices import BatchShares, device_rows
from . import images
from .ofrecord import part_files, raw_values, single_bytes
from .pipeline import RECORD, Collate, Field, Pipeline, RecordSource, reader_seed, register

OBJECT = np.dtype(object)       # the dtype of a reader's batch and of image lists (OneFlow's tensor_buffer)


def _device_share(api, batch_size, graph):
    """How many rows of a ``batch_size`` data op each device of ``graph`` gets (module docstring)."""
    n = graph.devices
    if n == 1 or graph.logical_view == "mirrored":
        return batch_size
    if batch_size % n:
        raise ValueError(f"{api}: batch_size must split evenly over the {n} devices set by flow.config (the "
                         f"consistent view gives each device batch_size / {n} rows), got {batch_size}")
    graph.split_batches.setdefault(batch_size, batch_size // n)     # flow.reshape(x, [batch_size, -1]) still works
    return batch_size // n


def _shared_rows(node, step, device, make):
    """``make()`` on one device; on several, this device's rows of the call's one ``make()`` (``BatchShares``)."""
    if device is None:
        return make()
    whole = node.attrs["shares"].take(step, device, make)
    return whole[device_rows(len(whole), device)]


def _positive_int(value, name, api):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{api}: {name} must be a positive int, got {value!r}")
    return int(value)


def _shape(shape, api):
    try:
        out = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"{api}: shape must be a list or tuple of ints, got {shape!r}") from None
    if any(d < 1 for d in out):
        raise ValueError(f"{api}: shape must hold positive ints, got {list(shape)}")
    return out


# --------------------------------------------------------------------------------------------- graph nodes

class OFRecordReader(Op):
    """One call's batch of records: pulled from the reader's pipeline by the host arguments of every call."""
    prefix, api = "OFRecord_Reader_", "flow.data.ofrecord_reader"
    side_effect = True      # takes one batch every call, and keeps a CuPy plan eager (new host data every call)
    batch_source = True     # its output is a whole batch, like a placeholder's (devices split such outputs)
    takes_device = True     # on several devices each takes its rows of the call's one batch

    @staticmethod
    def infer(pipeline, shares):
        return spec((pipeline.piece_size,), OBJECT)

    @staticmethod
    def host_args(node, step, device=None):
        return {"batch": _shared_rows(node, step, device, node.attrs["pipeline"].next_batch)}

    @staticmethod
    def forward(xp, pipeline, shares, batch, device):
        return batch


class PipelineOutput(Op):
    """Values a pipeline field prepared for this call: input 0 is the reader's batch, the rest (the field's inputs,
    for the graph's sake) are not read, except a CropMirrorNormalize's mirror flags (the last input when
    ``mirror_axis`` is set), applied here."""
    batch_source = True

    @staticmethod
    def infer(batch, *parents, pipeline, field, outs, mirror_axis=None):
        return [spec(*o) for o in outs] if len(outs) > 1 else spec(*outs[0])

    @staticmethod
    def forward(xp, batch, *parents, pipeline, field, outs, mirror_axis=None):
        values = []
        for j, (_, dtype) in enumerate(outs):
            value = batch.values[(field, j)]
            if np.dtype(dtype) != OBJECT and xp is not np:
                value = xp.asarray(value)
            values.append(value)
        if mirror_axis is not None:
            values[0] = _mirror(xp, values[0], parents[-1], mirror_axis)
        return values[0] if len(values) == 1 else tuple(values)


@functools.lru_cache(maxsize=None)
def _output_op(op_name, prefix, api, outputs=("out",)):
    """The ``PipelineOutput`` class of one API (its own name and prefix in graphs and messages)."""
    return type(op_name, (PipelineOutput,), {"prefix": prefix, "api": api, "outputs": outputs,
                                             "__doc__": f"The prepared output(s) of {api}."})


def _mirror(xp, images_, flags, axis):
    """Rows of ``images_`` whose flag is non-zero flipped along ``axis`` (the width), in place: ``images_`` is this
    call's own array (a prepared batch is taken once; the graph's CropMirrorNormalize makes a new one)."""
    rows = xp.flatnonzero(flags)
    if rows.size:
        images_[rows] = xp.flip(images_[rows], axis=axis)
    return images_


def _source(tensor, api, argument="input_blob"):
    """``(pipeline, reader tensor, (field, output))`` of a reader's batch or of a pipeline field's output."""
    if not isinstance(tensor, g.LazyTensor):
        raise TypeError(f"{api}: {argument} must be a tensor of the job, got {type(tensor).__name__}")
    node = tensor.node
    if node.op is OFRecordReader:
        return node.attrs["pipeline"], tensor, RECORD
    if isinstance(node.op, type) and issubclass(node.op, PipelineOutput):
        return node.attrs["pipeline"], node.inputs[0], (node.attrs["field"], tensor.index)
    return None


def _reader_source(tensor, api):
    found = _source(tensor, api)
    if found is None or found[2] != RECORD:
        made = tensor.node.op.api if isinstance(tensor, g.LazyTensor) else type(tensor).__name__
        raise TypeError(f"{api}: input_blob must be the output of flow.data.ofrecord_reader, got "
                        f"{getattr(tensor, 'logical_blob_name', tensor)} made by {made}")
    return found


def _add(op, source, parents, fn, outs, what, name, random=False, seed=None, extra_inputs=(), **attrs):
    """Register ``fn`` as a field of ``source``'s pipeline and add its graph node; returns its output(s)."""
    pipeline, reader, key = source
    graph = g.current_graph(op.api)
    if reader.graph is not graph:       # checked before the field joins that job's pipeline
        raise TraceError(f"{op.api}: its input belongs to job {reader.graph.name!r}, not to job {graph.name!r} "
                         "being traced")
    collates = tuple(Collate("list") if np.dtype(d) == OBJECT else Collate("stack", tuple(s[1:]), np.dtype(d))
                     for s, d in outs)
    field = pipeline.add_field(Field(fn, (key,), collates, what, random, seed))
    return apply(op, (reader, *parents, *extra_inputs), name, pipeline=pipeline, field=field,
                 outs=tuple((tuple(s), np.dtype(d)) for s, d in outs), **attrs)


def _key(blob_name, api):
    if not isinstance(blob_name, str) or not blob_name:
        raise TypeError(f"{api}: blob_name must be a non-empty string (a key of the records), got {blob_name!r}")
    return blob_name


# --------------------------------------------------------------------------------------------- reader

def ofrecord_reader(ofrecord_dir, batch_size=1, data_part_num=1, part_name_prefix="part-", part_name_suffix_length=-1,
                    random_shuffle=False, shuffle_buffer_size=1024, shuffle_after_epoch=False, name=None):
    """``flow.data.ofrecord_reader``: the records of the part files ``<ofrecord_dir>/<part_name_prefix><i>``,
    ``i < data_part_num`` zero-padded to ``part_name_suffix_length`` digits (-1: not padded), ``batch_size`` a
    call, endlessly. ``random_shuffle`` mixes records through a buffer of ``shuffle_buffer_size``;
    ``shuffle_after_epoch`` reads the part files in a new random order every epoch after the first.

    The output is the call's batch of records, for the decoders (``OFRecordRawDecoder`` …). Missing files are an
    error here, when the job is traced; a damaged record is an error of the call whose batch holds it.
    """
    api = "flow.data.ofrecord_reader"
    graph = g.current_graph(api)
    batch_size = _positive_int(batch_size, "batch_size", api)
    piece_size = _device_share(api, batch_size, graph)
    data_part_num = _positive_int(data_part_num, "data_part_num", api)
    if not isinstance(part_name_prefix, str):
        raise TypeError(f"{api}: part_name_prefix must be a string, got {part_name_prefix!r}")
    if not isinstance(part_name_suffix_length, numbers.Integral) or part_name_suffix_length < -1:
        raise ValueError(f"{api}: part_name_suffix_length must be -1 (no padding) or a digit count, "
                         f"got {part_name_suffix_length!r}")
    shuffle_buffer_size = _positive_int(shuffle_buffer_size, "shuffle_buffer_size", api)
    paths = part_files(ofrecord_dir, data_part_num, part_name_prefix, int(part_name_suffix_length), api)
    source = RecordSource(paths, bool(random_shuffle), shuffle_buffer_size, bool(shuffle_after_epoch))
    # a call reads the rows of every device: the logical batch (consistent view), batch_size a device (mirrored)
    pipeline = Pipeline("?", source, piece_size * graph.devices, piece_size=piece_size)
    out = apply(OFRecordReader, (), name, pipeline=pipeline, shares=BatchShares() if graph.devices > 1 else None)
    pipeline.name = out.node.name       # the node's name seeds its shuffles and random fields: runs repeat
    pipeline.seed = source.seed = reader_seed(session.default().seed, pipeline.name)
    register(pipeline)
    return out


def ofrecord_loader(ofrecord_dir, batch_size=1, data_part_num=1, part_name_prefix="part-", part_name_suffix_length=-1,
                    shuffle=False, shuffle_buffer_size=1024, name=None):
    """``flow.data.ofrecord_loader``, OneFlow's older name of ``ofrecord_reader``."""
    return ofrecord_reader(ofrecord_dir, batch_size, data_part_num, part_name_prefix, part_name_suffix_length,
                           random_shuffle=shuffle, shuffle_buffer_size=shuffle_buffer_size, name=name)


# --------------------------------------------------------------------------------------------- decoders

def OFRecordRawDecoder(input_blob, blob_name, shape, dtype, dim1_varying_length=False, auto_zero_padding=False,
                       name=None):
    """``flow.data.OFRecordRawDecoder``: the values under ``blob_name`` as an array ``(batch_size,) + shape`` of
    ``dtype``. Each record must hold exactly ``prod(shape)`` values (at most, zero-padded, with
    ``auto_zero_padding`` or ``dim1_varying_length``); integer dtypes never take float lists, and a bytes_list is
    read as raw bytes for int8/uint8 only (see ``ofrecord.raw_values``)."""
    api = "flow.data.OFRecordRawDecoder"
    source = _reader_source(input_blob, api)
    key, shape, dtype = _key(blob_name, api), _shape(shape, api), as_dtype(dtype, f"{api} dtype")
    count, pad = int(np.prod(shape, dtype=np.int64)), bool(dim1_varying_length or auto_zero_padding)

    def decode(inputs, rng):
        return (raw_values(inputs[0], key, dtype, count, pad, api).reshape(shape),)
    op = _output_op("OFRecordRawDecoder", "OFRecordRawDecoder_", api)
    return _add(op, source, (), decode, [((source[0].piece_size,) + shape, dtype)], f"{api}({key!r})", name)


def OFRecordBytesDecoder(input_blob, blob_name, name=None):
    """``flow.data.OFRecordBytesDecoder``: the one bytes value under ``blob_name`` of each record, as a list of
    uint8 arrays (for ``ImageDecoderRandomCropResize``)."""
    api = "flow.data.OFRecordBytesDecoder"
    source = _reader_source(input_blob, api)
    key = _key(blob_name, api)

    def decode(inputs, rng):
        return (np.frombuffer(single_bytes(inputs[0], key, api), dtype=np.uint8),)
    op = _output_op("OFRecordBytesDecoder", "OFRecordBytesDecoder_", api)
    return _add(op, source, (), decode, [((source[0].piece_size,), OBJECT)], f"{api}({key!r})", name)


def _image_key_decoder(api, key, color_space, crop=None):
    def decode(inputs, rng):
        data = single_bytes(inputs[0], key, api)
        window = None if crop is None else functools.partial(_crop_of, crop, rng)
        return (images.decode(data, color_space, window),)
    return decode


def _crop_of(crop, rng, height, width):
    return crop(height, width, rng)


def OFRecordImageDecoder(input_blob, blob_name, color_space="BGR", name=None):
    """``flow.data.OFRecordImageDecoder``: the encoded image under ``blob_name`` of each record, decoded into a
    uint8 ``(H, W, 3)`` image in ``color_space`` (``BGR``, ``RGB``) or ``(H, W, 1)`` (``GRAY``); a list of them."""
    api = "flow.data.OFRecordImageDecoder"
    source = _reader_source(input_blob, api)
    key, color_space = _key(blob_name, api), images.check_color_space(color_space, api)
    op = _output_op("OFRecordImageDecoder", "OFRecordImageDecoder_", api)
    return _add(op, source, (), _image_key_decoder(api, key, color_space), [((source[0].piece_size,), OBJECT)],
                f"{api}({key!r})", name)


def OFRecordImageDecoderRandomCrop(input_blob, blob_name, color_space="BGR", num_attempts=10, seed=None,
                                   random_area=(0.08, 1.0), random_aspect_ratio=(0.75, 1.333333), name=None):
    """``flow.data.OFRecordImageDecoderRandomCrop``: like ``OFRecordImageDecoder``, each image cut to a random
    window (``images.RandomCropWindow``: OneFlow's area/aspect-ratio rule) before its color is converted."""
    api = "flow.data.OFRecordImageDecoderRandomCrop"
    source = _reader_source(input_blob, api)
    key, color_space = _key(blob_name, api), images.check_color_space(color_space, api)
    crop = images.RandomCropWindow(num_attempts, random_area, random_aspect_ratio, api)
    op = _output_op("OFRecordImageDecoderRandomCrop", "OFRecordImageDecoderRandomCrop_", api)
    return _add(op, source, (), _image_key_decoder(api, key, color_space, crop), [((source[0].piece_size,), OBJECT)],
                f"{api}({key!r})", name, random=True, seed=_seed(seed, api))


def _seed(seed, api):
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{api}: seed must be a non-negative int or None, got {seed!r}")
    return int(seed)


def ImageDecoderRandomCropResize(input_blob, target_width, target_height, num_attempts=None, seed=None,
                                 random_area=None, random_aspect_ratio=None, num_workers=None, warmup_size=None,
                                 max_num_pixels=None, name=None):
    """``flow.data.ImageDecoderRandomCropResize``: encoded images (``OFRecordBytesDecoder``'s output) decoded, cut
    to a random window and resized to ``target_height`` x ``target_width``: a uint8 RGB batch
    ``(batch_size, target_height, target_width, 3)``. Resizing follows ``flow.image.Resize``'s "auto" rule (area
    when shrinking, bilinear when growing), where OneFlow's kernel always samples bilinearly (which aliases).

    JPEGs are decoded at a reduced scale (Pillow's ``draft``: 1/2, 1/4 or 1/8, done by libjpeg) when the window
    stays at least the target size there, which saves most of the decoding of large images. ``num_workers``,
    ``warmup_size`` and ``max_num_pixels`` tune OneFlow's GPU decoder and are accepted and ignored here (the
    pipeline's own threads decode).
    """
    api = "flow.data.ImageDecoderRandomCropResize"
    found = _source(input_blob, api)
    if found is None or found[2] == RECORD or input_blob.dtype != OBJECT:
        raise TypeError(f"{api}: input_blob must be the encoded images of flow.data.OFRecordBytesDecoder, got "
                        f"{getattr(input_blob, 'logical_blob_name', input_blob)}")
    width, height = _positive_int(target_width, "target_width", api), _positive_int(target_height, "target_height", api)
    crop = images.RandomCropWindow(10 if num_attempts is None else num_attempts,
                                   (0.08, 1.0) if random_area is None else random_area,
                                   (0.75, 1.333333) if random_aspect_ratio is None else random_aspect_ratio, api)

    def decode(inputs, rng):
        return (_decode_crop_resize(bytes(inputs[0]), crop, rng, width, height),)
    op = _output_op("ImageDecoderRandomCropResize", "ImageDecoderRandomCropResize_", api)
    return _add(op, found, (input_blob,), decode, [((found[0].piece_size, height, width, 3), np.uint8)],
                f"{api}", name, random=True, seed=_seed(seed, api))


def _decode_crop_resize(data, crop, rng, width, height):
    try:
        image = Image.open(io.BytesIO(data))
    except Exception as e:
        raise images.ImageDecodeError(f"cannot decode {len(data)} bytes as an image ({type(e).__name__}: {e})") \
            from None
    full_w, full_h = image.size
    y, x, h, w = crop(full_h, full_w, rng)
    if image.format == "JPEG":
        scale = 1
        while scale < 8 and h // (2 * scale) >= height and w // (2 * scale) >= width:
            scale *= 2
        if scale > 1:
            image.draft("RGB", (math.ceil(full_w / scale), math.ceil(full_h / scale)))
    try:
        image.load()
    except Exception as e:
        raise images.ImageDecodeError(f"cannot decode {len(data)} bytes as an image ({type(e).__name__}: {e})") \
            from None
    if image.mode != "RGB":
        image = image.convert("RGB")
    sx, sy = image.width / full_w, image.height / full_h       # the draft's reduction
    box = (x * sx, y * sy, (x + w) * sx, (y + h) * sy)
    resample = images.resample_filter("auto", (h * sy, w * sx), (height, width))
    return np.asarray(image.resize((width, height), resample, box=box))


# --------------------------------------------------------------------------------------------- flow.image

def _image_field(image, api, argument="image"):
    found = _source(image, api, argument)
    if found is None or found[2] == RECORD:
        raise TypeError(f"{api}: {argument} must be images from a flow.data image decoder (or another flow.image op "
                        f"on them), got {getattr(image, 'logical_blob_name', image)} made by "
                        f"{image.node.op.api if isinstance(image, g.LazyTensor) else type(image).__name__}")
    if image.dtype != OBJECT and not (image.ndim == 4 and image.dtype == np.uint8):
        raise TypeError(f"{api}: {argument} must be decoded uint8 images, got {image.dtype}{list(image.shape)}")
    return found


def _check_image(value, channels_, api):
    if not isinstance(value, np.ndarray) or value.ndim != 3:
        raise ValueError(f"{api}: expected an image (H, W, C), got {getattr(value, 'shape', type(value).__name__)}")
    if value.shape[2] != channels_:
        raise ValueError(f"{api}: expected images with {channels_} channel(s), got shape {value.shape}")
    return value


def Resize(image, target_size=None, min_size=None, max_size=None, keep_aspect_ratio=False, resize_side="shorter",
           channels=3, dtype=None, interpolation_type="auto", name=None, color_space=None, interp_type=None,
           resize_shorter=0, resize_x=0, resize_y=0):
    """``flow.image.Resize`` on decoded images. Returns ``(image, scale, new_size)`` as OneFlow:

    - ``keep_aspect_ratio=False``: ``target_size=(width, height)``; ``image`` is a batch ``(N, height, width,
      channels)`` of ``dtype`` (uint8 unless given; float32 allowed), ``scale`` float32 ``(N, 2)`` = (new w / w,
      new h / h), ``new_size`` None;
    - ``keep_aspect_ratio=True``: ``target_size`` an int, the ``resize_side`` ("shorter"/"longer") side becomes
      it, the other keeps the aspect ratio (bounded by ``max_size`` / ``min_size``); ``image`` a list of images,
      ``scale`` float32 ``(N, 2)``, ``new_size`` int32 ``(N, 2)`` = (new w, new h).

    The deprecated ``resize_x``/``resize_y``, ``resize_shorter``, ``color_space`` and ``interp_type`` still work and
    then, as in OneFlow, only the image is returned. ``interpolation_type``: auto (area when shrinking, bilinear
    else), bilinear, nearest_neighbor, bicubic, area (Pillow's filters, see ``images.RESAMPLE``).
    """
    api = "flow.image.Resize"
    found = _image_field(image, api)
    deprecated = False
    if color_space is not None:
        deprecated = True
        channels = images.channels(images.check_color_space(color_space, api))
    if interp_type is not None:
        deprecated = True
        legacy = {"Linear": "bilinear", "NN": "nearest_neighbor", "Cubic": "bicubic"}
        if interp_type not in legacy:
            raise ValueError(f"{api}: interp_type must be one of {', '.join(legacy)}, got {interp_type!r}")
        interpolation_type = legacy[interp_type]
    if resize_x > 0 and resize_y > 0:
        deprecated, target_size, keep_aspect_ratio = True, (resize_x, resize_y), False
    if resize_shorter > 0:
        deprecated, target_size, keep_aspect_ratio, resize_side = True, resize_shorter, True, "shorter"
    if interpolation_type not in images.INTERPOLATIONS:
        raise ValueError(f"{api}: interpolation_type must be one of {', '.join(images.INTERPOLATIONS)}, "
                         f"got {interpolation_type!r}")
    if channels not in (1, 3):
        raise ValueError(f"{api}: channels must be 1 or 3, got {channels!r}")
    n = found[0].piece_size
    if keep_aspect_ratio:
        if isinstance(target_size, bool) or not isinstance(target_size, numbers.Integral) or target_size < 1:
            raise ValueError(f"{api}: target_size must be a positive int when keep_aspect_ratio is True, "
                             f"got {target_size!r}")
        if resize_side not in ("shorter", "longer"):
            raise ValueError(f"{api}: resize_side must be 'shorter' or 'longer', got {resize_side!r}")
        min_size, max_size = int(min_size or 0), int(max_size or 0)
        if min_size and target_size < min_size or max_size and target_size > max_size:
            raise ValueError(f"{api}: target_size {target_size} must lie within min_size {min_size or '-'} and "
                             f"max_size {max_size or '-'}")
        if dtype is not None:
            raise ValueError(f"{api}: dtype applies to keep_aspect_ratio=False only (the images keep theirs)")
        longer = resize_side == "longer"

        def resize_keep(inputs, rng):
            img = _check_image(inputs[0], channels, api)
            h, w = img.shape[:2]
            new_w, new_h = images.keep_aspect_size(h, w, int(target_size), longer, min_size, max_size)
            out = images.resize(img, new_w, new_h, interpolation_type)
            return out, np.array([new_w, new_h], np.int32), np.array([new_w / w, new_h / h], np.float32)
        op = _output_op("ImageResizeKeepAspectRatio", "ImageResize_", api, ("out", "size", "scale"))
        out, size, scale = _add(op, found, (image,), resize_keep,
                                [((n,), OBJECT), ((n, 2), np.int32), ((n, 2), np.float32)], api, name)
        return out if deprecated else (out, scale, size)
    if (not isinstance(target_size, (list, tuple)) or len(target_size) != 2 or
            not all(isinstance(s, numbers.Integral) and s > 0 for s in target_size)):
        raise ValueError(f"{api}: target_size must be (width, height), two positive ints, when keep_aspect_ratio is "
                         f"False, got {target_size!r}")
    width, height = (int(s) for s in target_size)
    dtype = np.dtype(np.uint8) if dtype is None else as_dtype(dtype, f"{api} dtype")
    if dtype not in (np.uint8, np.float32):
        raise ValueError(f"{api}: dtype must be flow.uint8 or flow.float32, got {dtype}")

    def resize_fixed(inputs, rng):
        img = _check_image(inputs[0], channels, api)
        h, w = img.shape[:2]
        out = images.resize(img, width, height, interpolation_type)
        return out.astype(dtype, copy=False), np.array([width / w, height / h], np.float32)
    op = _output_op("ImageResizeToFixed", "ImageResize_", api, ("out", "scale"))
    out, scale = _add(op, found, (image,), resize_fixed, [((n, height, width, channels), dtype), ((n, 2), np.float32)],
                      api, name)
    return out if deprecated else (out, scale, None)


def target_resize(images_, target_size, min_size=None, max_size=None, resize_side="shorter",
                  interpolation_type="auto", name=None):
    """``flow.image.target_resize``: ``Resize`` keeping the aspect ratio; returns ``(image, new_size, scale)``
    (this order, as OneFlow's)."""
    out, scale, size = Resize(images_, target_size=target_size, min_size=min_size, max_size=max_size,
                              keep_aspect_ratio=True, resize_side=resize_side, interpolation_type=interpolation_type,
                              name=name)
    return out, size, scale


def image_decode(images_bytes_buffer, dtype=np.uint8, color_space="BGR", name=None):
    """``flow.image.decode``: encoded images (``flow.data.OFRecordBytesDecoder``'s output) decoded into a list of
    uint8 images in ``color_space`` (as ``OFRecordImageDecoder``)."""
    api = "flow.image.decode"
    found = _source(images_bytes_buffer, api, "images_bytes_buffer")
    if found is None or found[2] == RECORD or images_bytes_buffer.dtype != OBJECT:
        raise TypeError(f"{api}: images_bytes_buffer must be the encoded images of flow.data.OFRecordBytesDecoder, "
                        f"got {getattr(images_bytes_buffer, 'logical_blob_name', images_bytes_buffer)}")
    if as_dtype(dtype, f"{api} dtype") != np.uint8:
        raise ValueError(f"{api}: dtype must be flow.uint8, as OneFlow's decoder, got {dtype!r}")
    color_space = images.check_color_space(color_space, api)

    def decode(inputs, rng):
        return (images.decode(bytes(inputs[0]), color_space),)
    op = _output_op("ImageDecode", "ImageDecode_", api)
    return _add(op, found, (images_bytes_buffer,), decode, [((found[0].piece_size,), OBJECT)], api, name)


def image_random_crop(input_blob, num_attempts=10, seed=None, random_area=None, random_aspect_ratio=None,
                      name=None):
    """``flow.image.random_crop``: each decoded image cut to a random window (OneFlow's rule, see
    ``images.RandomCropWindow``); a list of images."""
    api = "flow.image.random_crop"
    found = _image_field(input_blob, api, "input_blob")
    crop = images.RandomCropWindow(num_attempts, (0.08, 1.0) if random_area is None else random_area,
                                   (0.75, 1.333333) if random_aspect_ratio is None else random_aspect_ratio, api)

    def cut(inputs, rng):
        img = inputs[0]
        y, x, h, w = crop(img.shape[0], img.shape[1], rng)
        return (np.ascontiguousarray(img[y:y + h, x:x + w]),)
    op = _output_op("ImageRandomCrop", "ImageRandomCrop_", api)
    return _add(op, found, (input_blob,), cut, [((found[0].piece_size,), OBJECT)], api, name, random=True,
                seed=_seed(seed, api))


class CropMirrorNormalizeOp(Op):
    """CropMirrorNormalize of a uint8 batch ``(N, H, W, C)`` that is a plain tensor of the job (not prepared by a
    reader's pipeline): computed in the graph, with ``xp``."""
    prefix, api = "CropMirrorNormalize_", "flow.image.CropMirrorNormalize"

    @staticmethod
    def infer(x, *mirror, crop_h, crop_w, pos_y, pos_x, mean, inv_std, layout):
        n, _, _, c = x.shape
        return spec((n, c, crop_h, crop_w) if layout == "NCHW" else (n, crop_h, crop_w, c), np.float32)

    @staticmethod
    def forward(xp, x, *mirror, crop_h, crop_w, pos_y, pos_x, mean, inv_std, layout):
        _, H, W, _ = x.shape
        y0, x0 = images.crop_offset(H, crop_h, pos_y), images.crop_offset(W, crop_w, pos_x)
        out = (x[:, y0:y0 + crop_h, x0:x0 + crop_w].astype(np.float32) - xp.asarray(mean)) * xp.asarray(inv_std)
        if layout == "NCHW":
            out = xp.ascontiguousarray(out.transpose(0, 3, 1, 2))
        if mirror:
            out = _mirror(xp, out, mirror[0], 3 if layout == "NCHW" else 2)
        return out


def CropMirrorNormalize(input_blob, mirror_blob=None, color_space="BGR", output_layout="NCHW", crop_h=0, crop_w=0,
                        crop_pos_y=0.5, crop_pos_x=0.5, mean=(0.0,), std=(1.0,), output_dtype=np.float32, name=None):
    """``flow.image.CropMirrorNormalize``: a float32 batch ``(N, C, crop_h, crop_w)`` (NCHW) or ``(N, crop_h,
    crop_w, C)`` (NHWC) of each image's window at ``(crop_pos_y, crop_pos_x)`` (anchor ``(H - crop_h) * pos_y``,
    truncated), flipped left-right where ``mirror_blob`` (int8 ``(N,)``, e.g. ``flow.random.CoinFlip``) is
    non-zero, normalized as ``(x - mean[c]) / std[c]``. ``mean``/``std`` have 1 or C values, in the images'
    channel order (the decoder's ``color_space``: RGB means mean=[R, G, B]).

    Images of varying size (a decoder's or a keep-aspect Resize's list) need ``crop_h`` and ``crop_w``; for a batch
    of one size 0 means the whole image and larger crops are cut to the image, as OneFlow.
    """
    api = "flow.image.CropMirrorNormalize"
    color_space = images.check_color_space(color_space, api)
    c = images.channels(color_space)
    if output_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"{api}: output_layout must be 'NCHW' or 'NHWC', got {output_layout!r}")
    if as_dtype(output_dtype, f"{api} output_dtype") != np.float32:
        raise ValueError(f"{api}: output_dtype must be flow.float (float32), as in OneFlow, got {output_dtype!r}")
    mean_v, std_v = _per_channel(mean, "mean", c, api), _per_channel(std, "std", c, api)
    if np.any(std_v == 0):
        raise ValueError(f"{api}: std must not hold 0, got {list(std)}")
    inv_std = (1.0 / std_v).astype(np.float32)
    for value, arg in ((crop_h, "crop_h"), (crop_w, "crop_w")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{api}: {arg} must be a non-negative int, got {value!r}")
    for value, arg in ((crop_pos_y, "crop_pos_y"), (crop_pos_x, "crop_pos_x")):
        if not isinstance(value, numbers.Real) or not 0 <= value <= 1:
            raise ValueError(f"{api}: {arg} must be a number in [0, 1], got {value!r}")
    if not isinstance(input_blob, g.LazyTensor):
        raise TypeError(f"{api}: input_blob must be a tensor of the job, got {type(input_blob).__name__}")
    found = _source(input_blob, api)
    n = input_blob.shape[0]
    extra = ()
    if mirror_blob is not None:
        if not isinstance(mirror_blob, g.LazyTensor):
            raise TypeError(f"{api}: mirror_blob must be a tensor of the job (flow.random.CoinFlip), "
                            f"got {type(mirror_blob).__name__}")
        if mirror_blob.dtype != np.int8 or mirror_blob.shape != (n,):
            raise ShapeError(f"{api}: mirror_blob must be int8 of shape ({n},), one flag an image, got "
                             f"{mirror_blob.dtype}{list(mirror_blob.shape)} (at {g.user_source_line()})")
        extra = (mirror_blob,)
    if input_blob.dtype == OBJECT:
        if found is None:
            raise TypeError(f"{api}: input_blob {input_blob.logical_blob_name} is not a batch of images")
        if not crop_h or not crop_w:
            raise ValueError(f"{api}: images of varying size need crop_h and crop_w (both > 0), got crop_h={crop_h}, "
                             f"crop_w={crop_w}")
        ch, cw = int(crop_h), int(crop_w)
    else:
        if input_blob.ndim != 4 or input_blob.dtype != np.uint8 or input_blob.shape[3] != c:
            raise ShapeError(f"{api}: input_blob must be uint8 images (N, H, W, {c}) for color_space {color_space}, "
                             f"got {input_blob.dtype}{list(input_blob.shape)} (at {g.user_source_line()})")
        _, H, W, _ = input_blob.shape
        ch, cw = (H, W) if not crop_h or not crop_w else (min(int(crop_h), H), min(int(crop_w), W))
    pos_y, pos_x = float(crop_pos_y), float(crop_pos_x)
    table = images.normalize_table(mean_v, inv_std)
    out_shape = (n, c, ch, cw) if output_layout == "NCHW" else (n, ch, cw, c)
    if found is None:       # a plain uint8 tensor of the job: in the graph
        return apply(CropMirrorNormalizeOp, (input_blob, *extra), name, crop_h=ch, crop_w=cw, pos_y=pos_y,
                     pos_x=pos_x, mean=mean_v, inv_std=inv_std, layout=output_layout)

    def cmn(inputs, rng):
        img = _check_image(inputs[0], c, api)
        if img.dtype != np.uint8:
            raise ValueError(f"{api}: expected uint8 images, got {img.dtype}")
        if img.shape[0] < ch or img.shape[1] < cw:
            raise ValueError(f"{api}: image of shape {img.shape} is smaller than the crop {ch}x{cw}")
        return (images.crop_mirror_normalize(img, ch, cw, pos_y, pos_x, table, output_layout),)
    op = _output_op("CropMirrorNormalize", "CropMirrorNormalize_", api)
    return _add(op, found, (input_blob,), cmn, [(out_shape, np.float32)], api, name, extra_inputs=extra,
                mirror_axis=(3 if output_layout == "NCHW" else 2) if extra else None)


def _per_channel(values, name, c, api):
    try:
        array = np.asarray([float(v) for v in values], np.float32)
    except (TypeError, ValueError):
        raise TypeError(f"{api}: {name} must be a list of numbers, got {values!r}") from None
    if array.size not in (1, c):
        raise ValueError(f"{api}: {name} must have 1 or {c} values (one a channel), got {list(values)}")
    return np.broadcast_to(array, (c,)).copy()


# --------------------------------------------------------------------------------------------- random sources

class CoinFlip(Op):
    """int8 ``(batch_size,)``: 1 with probability ``probability``, new every call. With a ``generator`` of its own
    (a ``seed``) the flags of all devices come from it, drawn once a call; without one each device draws its own
    from its plan's stream, as dropout does."""
    prefix, api = "CoinFlip_", "flow.random.CoinFlip"
    random = True
    batch_source = True
    takes_device = True

    @staticmethod
    def infer(batch_size, probability, generator, shares):
        return spec((batch_size,), np.int8)

    @staticmethod
    def host_args(node, step, device=None):
        generator, probability = node.attrs["generator"], node.attrs["probability"]
        if generator is None:
            return {"flags": None}
        rows = node.attrs["batch_size"] * (device.count if device is not None else 1)
        return {"flags": _shared_rows(node, step, device,
                                      lambda: (generator.random(rows) < probability).astype(np.int8))}

    @staticmethod
    def forward(xp, batch_size, probability, generator, shares, flags, device, rng):
        if flags is None:               # the plan's stream (flow.config.seed)
            return (rng.random(batch_size, dtype=np.float32) < probability).astype(np.int8)
        return xp.asarray(flags)


def coin_flip(batch_size=1, seed=None, probability=0.5, name=None):
    """``flow.random.CoinFlip``: int8 flags ``(batch_size,)``, each 1 with ``probability`` (mirror flags for
    ``flow.image.CropMirrorNormalize``). ``seed`` gives it a stream of its own."""
    api = "flow.random.CoinFlip"
    graph = g.current_graph(api)
    batch_size = _device_share(api, _positive_int(batch_size, "batch_size", api), graph)
    if not isinstance(probability, numbers.Real) or not 0 <= probability <= 1:
        raise ValueError(f"{api}: probability must be a number in [0, 1], got {probability!r}")
    seed = _seed(seed, api)
    generator = None if seed is None else np.random.default_rng(seed)
    return apply(CoinFlip, (), name, batch_size=batch_size, probability=float(probability), generator=generator,
                 shares=BatchShares() if graph.devices > 1 else None)


class DecodeRandom(Op):
    """``(batch_size,) + shape`` values of an initializer, new every call (the inputs, a ``tick``, only order it);
    on several devices drawn once a call for all and handed out in rows."""
    prefix, api = "DecodeRandom_", "flow.data.decode_random"
    random = True           # new values every call: keeps a CuPy plan eager
    batch_source = True
    takes_device = True

    @staticmethod
    def infer(*tick, shape, dtype, initializer, generator, shares):
        return spec(shape, dtype)

    @staticmethod
    def host_args(node, step, device=None):
        shape, dtype = node.attrs["shape"], node.attrs["dtype"]
        whole = (shape[0] * (device.count if device is not None else 1),) + tuple(shape[1:])
        return {"values": _shared_rows(node, step, device,
                                       lambda: node.attrs["initializer"](whole, dtype, node.attrs["generator"]))}

    @staticmethod
    def forward(xp, *tick, shape, dtype, initializer, generator, shares, values, device, rng):
        return xp.asarray(values)


def decode_random(shape, dtype, batch_size=1, initializer=None, tick=None, name=None):
    """``flow.data.decode_random``: synthetic data, ``(batch_size,) + shape`` of ``dtype`` drawn from
    ``initializer`` (``flow.random_uniform_initializer()``, [0, 1), by default). New values every call (OneFlow
    fills its buffer once and repeats it); the stream is seeded by ``flow.config.seed`` and the op's name."""
    api = "flow.data.decode_random"
    graph = g.current_graph(api)
    shape = _shape(shape, api)
    dtype = as_dtype(dtype, f"{api} dtype")
    batch_size = _device_share(api, _positive_int(batch_size, "batch_size", api), graph)
    initializer = random_uniform_initializer() if initializer is None else initializer
    if not isinstance(initializer, Initializer) and not callable(initializer):
        raise TypeError(f"{api}: initializer must be a flowlab initializer (flow.random_uniform_initializer() …), "
                        f"got {initializer!r}")
    if tick is not None and not isinstance(tick, g.LazyTensor):
        raise TypeError(f"{api}: tick must be a tensor of the job, got {type(tick).__name__}")
    out = apply(DecodeRandom, (tick,) if tick is not None else (), name, shape=(batch_size,) + shape, dtype=dtype,
                initializer=initializer, generator=None, shares=BatchShares() if graph.devices > 1 else None)
    out.node.attrs["generator"] = np.random.default_rng(
        [session.default().seed, zlib.crc32(out.node.name.encode())])
    return out


# --------------------------------------------------------------------------------------------- decode_ofrecord

class RawCodec:
    """``flow.data.RawCodec``: the record's values as they are (``OFRecordRawDecoder``'s rules)."""

    def __init__(self, auto_zero_padding=False):
        self.auto_zero_padding = bool(auto_zero_padding)


class BytesListCodec:
    """``flow.data.BytesListCodec``: a bytes_list's values, one a row of the last axis (zero-padded); int8."""


class ImagePreprocessor:
    """``flow.data.ImagePreprocessor("bgr2rgb" | "mirror")``: a step of ``ImageCodec``. ``mirror`` flips each image
    left-right with probability 1/2."""

    def __init__(self, preprocessor):
        if not isinstance(preprocessor, str) or preprocessor.lower() not in ("bgr2rgb", "mirror"):
            raise ValueError(f'flow.data.ImagePreprocessor: preprocessor must be "bgr2rgb" or "mirror", '
                             f'got {preprocessor!r}')
        self.preprocessor = preprocessor.lower()


class ImageResizePreprocessor:
    """``flow.data.ImageResizePreprocessor(width, height)``: a step of ``ImageCodec`` (bilinear)."""

    def __init__(self, width, height):
        self.width = _positive_int(width, "width", "flow.data.ImageResizePreprocessor")
        self.height = _positive_int(height, "height", "flow.data.ImageResizePreprocessor")


class ImageCodec:
    """``flow.data.ImageCodec(image_preprocessors)``: decode the encoded image (BGR, or one channel for a grayscale
    image, as OpenCV's ``IMREAD_ANYCOLOR``), run the preprocessors in order, then match the blob's channel count."""

    def __init__(self, image_preprocessors=None):
        steps = list(image_preprocessors) if isinstance(image_preprocessors, (list, tuple)) else []
        for step in steps:
            if not isinstance(step, (ImagePreprocessor, ImageResizePreprocessor)):
                raise TypeError(f"flow.data.ImageCodec: image_preprocessors must be ImagePreprocessor or "
                                f"ImageResizePreprocessor objects, got {step!r}")
        self.image_preprocessors = steps


class NormByChannelPreprocessor:
    """``flow.data.NormByChannelPreprocessor(mean_values, std_values=(1, 1, 1), data_format="channels_last")``:
    ``(x - mean[c]) / std[c]`` over the channel axis (the last, the first, or none: ``"no_channel"``)."""

    def __init__(self, mean_values, std_values=(1.0, 1.0, 1.0), data_format="channels_last"):
        api = "flow.data.NormByChannelPreprocessor"
        if not isinstance(mean_values, (list, tuple)) or not isinstance(std_values, (list, tuple)):
            raise TypeError(f"{api}: mean_values and std_values must be lists, got {mean_values!r}, {std_values!r}")
        if std_values and len(std_values) != len(mean_values):
            raise ValueError(f"{api}: std_values must have as many values as mean_values ({len(mean_values)}), "
                             f"got {list(std_values)}")
        if data_format not in ("channels_last", "channels_first", "no_channel"):
            raise ValueError(f"{api}: data_format must be channels_last, channels_first or no_channel, "
                             f"got {data_format!r}")
        if data_format == "no_channel" and len(mean_values) != 1:
            raise ValueError(f"{api}: no_channel takes one mean value, got {list(mean_values)}")
        self.mean_values, self.std_values, self.data_format = list(mean_values), list(std_values), data_format

    def apply(self, value, api):
        mean = np.asarray(self.mean_values, np.float64)
        std = np.asarray(self.std_values or [1.0] * len(self.mean_values), np.float64)
        if self.data_format == "channels_last":
            if value.shape[-1] != mean.size:
                raise ValueError(f"{api}: NormByChannelPreprocessor has {mean.size} mean values, the blob has "
                                 f"{value.shape[-1]} channels (last axis)")
            return (value - mean) / std
        if self.data_format == "channels_first":
            if value.shape[0] != mean.size:
                raise ValueError(f"{api}: NormByChannelPreprocessor has {mean.size} mean values, the blob has "
                                 f"{value.shape[0]} channels (first axis)")
            per_channel = (-1,) + (1,) * (value.ndim - 1)
            return (value - mean.reshape(per_channel)) / std.reshape(per_channel)
        return (value - mean[0]) / std[0]


class BlobConf:
    """``flow.data.BlobConf(name, shape, dtype, codec, preprocessors=None)``: one output of ``decode_ofrecord``:
    the key ``name`` decoded by ``codec`` into ``shape`` (per record) of ``dtype``, then ``preprocessors``
    (``NormByChannelPreprocessor``) applied."""

    def __init__(self, name, shape, dtype, codec, preprocessors=None):
        api = "flow.data.BlobConf"
        if not isinstance(name, str) or not name:
            raise TypeError(f"{api}: name must be a non-empty string, got {name!r}")
        if not isinstance(shape, (list, tuple)):
            raise TypeError(f"{api}: shape must be a list or tuple, got {shape!r}")
        if not isinstance(codec, (RawCodec, ImageCodec, BytesListCodec)):
            raise TypeError(f"{api}: codec must be flow.data.RawCodec(), ImageCodec(...) or BytesListCodec(), "
                            f"got {codec!r}")
        steps = list(preprocessors) if isinstance(preprocessors, (list, tuple)) else []
        for step in steps:
            if not isinstance(step, NormByChannelPreprocessor):
                raise TypeError(f"{api}({name!r}): preprocessors must be NormByChannelPreprocessor objects (image "
                                f"steps belong in ImageCodec), got {step!r}")
        self.name, self.shape, self.dtype = name, tuple(int(d) for d in shape), as_dtype(dtype, f"{api} dtype")
        self.codec, self.preprocessors = codec, steps
        if isinstance(codec, ImageCodec) and (len(self.shape) != 3 or self.shape[2] not in (1, 3)):
            raise ValueError(f"{api}({name!r}): an image blob's shape is (height, width, 1 or 3), got {list(shape)}")
        if isinstance(codec, BytesListCodec) and self.dtype != np.int8:
            raise ValueError(f"{api}({name!r}): BytesListCodec decodes to flow.int8, got {self.dtype}")


def _legacy_image(rec, blob: BlobConf, rng, api):
    data = single_bytes(rec, blob.name, api)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as e:
        raise images.ImageDecodeError(f"cannot decode {len(data)} bytes as an image ({type(e).__name__}: {e})") \
            from None
    array = images.to_array(image, "GRAY" if image.mode in ("L", "1", "I", "I;16") else "BGR")
    for step in blob.codec.image_preprocessors:
        if isinstance(step, ImageResizePreprocessor):
            array = images.resize(array, step.width, step.height, "bilinear")
        elif step.preprocessor == "bgr2rgb":
            array = array[:, :, ::-1] if array.shape[2] == 3 else array
        elif rng.integers(2):
            array = array[:, ::-1]
    want = blob.shape[2]
    if array.shape[2] != want:      # BGR <-> gray, as OpenCV's cvtColor
        array = images.to_array(images.from_array(np.ascontiguousarray(array[:, :, ::-1])), "GRAY") \
            if want == 1 else np.repeat(array, 3, axis=2)
    if array.shape != blob.shape:
        raise ValueError(f"image {blob.name!r} decodes to shape {array.shape} after its preprocessors, the blob is "
                         f"{blob.shape} (add an ImageResizePreprocessor)")
    return array.astype(blob.dtype)


def _legacy_bytes_list(rec, blob: BlobConf, api):
    from .ofrecord import OFRecordError, feature_of
    feature = feature_of(rec, blob.name, api)
    if feature.WhichOneof("kind") != "bytes_list":
        raise OFRecordError(f"{api}: {rec.where()}: key {blob.name!r} holds a {feature.WhichOneof('kind')}, "
                            "BytesListCodec needs a bytes_list")
    rows = int(np.prod(blob.shape[:-1], dtype=np.int64)) if len(blob.shape) > 1 else 1
    length = blob.shape[-1] if blob.shape else 1
    values = feature.bytes_list.value
    if len(values) > rows or any(len(v) > length for v in values):
        raise OFRecordError(f"{api}: {rec.where()}: key {blob.name!r} holds {len(values)} bytes value(s) of up to "
                            f"{max(map(len, values), default=0)} bytes; blob shape {blob.shape} takes {rows} of at "
                            f"most {length}")
    out = np.zeros((rows, length), np.int8)
    for i, v in enumerate(values):
        out[i, :len(v)] = np.frombuffer(v, np.int8)
    return out.reshape(blob.shape)


def decode_ofrecord(ofrecord_dir, blobs, batch_size=1, data_part_num=1, part_name_prefix="part-",
                    part_name_suffix_length=-1, shuffle=False, buffer_size=1024, name=None):
    """``flow.data.decode_ofrecord`` (OneFlow's older API): reads the dataset like ``ofrecord_reader`` and decodes
    each ``BlobConf`` into an array ``(batch_size,) + blob.shape``; returns them in the order of ``blobs``."""
    api = "flow.data.decode_ofrecord"
    if not isinstance(blobs, (list, tuple)) or not blobs or not all(isinstance(b, BlobConf) for b in blobs):
        raise TypeError(f"{api}: blobs must be a non-empty list of flow.data.BlobConf, got {blobs!r}")
    if name is None:
        name = f"Decode_{g.new_unique_id()}"
    elif not isinstance(name, str):
        raise TypeError(f"{api}: name must be a string, got {name!r}")
    reader = ofrecord_reader(ofrecord_dir, batch_size, data_part_num, part_name_prefix, part_name_suffix_length,
                             shuffle, buffer_size, False, name=f"{name}_reader")
    source = _reader_source(reader, api)
    op = _output_op("DecodeOFRecord", "Decode_", api)
    outputs = []
    for blob in blobs:
        count = int(np.prod(blob.shape, dtype=np.int64))

        def decode(inputs, rng, blob=blob, count=count):
            rec = inputs[0]
            if isinstance(blob.codec, ImageCodec):
                value = _legacy_image(rec, blob, rng, api)
            elif isinstance(blob.codec, BytesListCodec):
                value = _legacy_bytes_list(rec, blob, api)
            else:
                value = raw_values(rec, blob.name, blob.dtype, count, blob.codec.auto_zero_padding,
                                   api).reshape(blob.shape)
            for step in blob.preprocessors:
                value = step.apply(value, api).astype(blob.dtype)
            return (value,)
        random_ = isinstance(blob.codec, ImageCodec) and any(
            isinstance(s, ImagePreprocessor) and s.preprocessor == "mirror" for s in blob.codec.image_preprocessors)
        outputs.append(_add(op, source, (), decode, [((source[0].piece_size,) + blob.shape, blob.dtype)],
                            f"{api}({blob.name!r})", f"{name}_{blob.name.replace('/', '_')}", random=random_))
    return tuple(outputs)
