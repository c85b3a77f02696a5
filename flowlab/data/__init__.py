"""Data: datasets in OneFlow 0.x's batched layout (MNIST, downloaded; 8x8 digits, bundled), OFRecord files
(``flowlab.data.ofrecord``: write and read them) and the in-job OFRecord pipeline (``flowlab.data.ops``:
``flow.data.ofrecord_reader`` and its decoders, ``decode_ofrecord``, ``decode_random``)."""

from . import ofrecord
from .digits import load_digits, load_digits_arrays
from .mnist import load_mnist
from .ofrecord import OFRecordError, OFRecordWriter, read_records, write_dataset
from .ops import (BlobConf, BytesListCodec, ImageCodec, ImageDecoderRandomCropResize, ImagePreprocessor,
                  ImageResizePreprocessor, NormByChannelPreprocessor, OFRecordBytesDecoder, OFRecordImageDecoder,
                  OFRecordImageDecoderRandomCrop, OFRecordRawDecoder, RawCodec, decode_ofrecord, decode_random,
                  ofrecord_loader, ofrecord_reader)
from .pipeline import close_all as _close_pipelines

ofrecord_raw_decoder = OFRecordRawDecoder
ofrecord_bytes_decoder = OFRecordBytesDecoder
ofrecord_image_decoder = OFRecordImageDecoder
ofrecord_image_decoder_random_crop = OFRecordImageDecoderRandomCrop
image_decoder_random_crop_resize = ImageDecoderRandomCropResize


def _register_shutdown():
    from ..runtime import session
    session.on_clear(_close_pipelines)     # flow.clear_default_session() stops the readers' threads


_register_shutdown()

__all__ = ["BlobConf", "BytesListCodec", "ImageCodec", "ImageDecoderRandomCropResize", "ImagePreprocessor",
           "ImageResizePreprocessor", "NormByChannelPreprocessor", "OFRecordBytesDecoder", "OFRecordError",
           "OFRecordImageDecoder", "OFRecordImageDecoderRandomCrop", "OFRecordRawDecoder", "OFRecordWriter",
           "RawCodec", "decode_ofrecord", "decode_random", "image_decoder_random_crop_resize", "load_digits",
           "load_digits_arrays", "load_mnist", "ofrecord", "ofrecord_bytes_decoder", "ofrecord_image_decoder",
           "ofrecord_image_decoder_random_crop", "ofrecord_loader", "ofrecord_raw_decoder", "ofrecord_reader",
           "read_records", "write_dataset"]
