"""Per-image work of the data pipeline, on the host: decoding (Pillow), OneFlow's random crop window, resizing,
crop-mirror-normalize. Images are uint8 NumPy arrays ``(H, W, C)``, C = 3 (in the color space asked for) or 1.

OneFlow decodes with OpenCV; flowlab decodes with Pillow (libjpeg-turbo both), so decoded pixels agree, and
resamples with Pillow's filters, whose rounding differs from OpenCV's by a grey level here and there (see
``RESAMPLE``).
"""
from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

COLOR_SPACES = ("RGB", "BGR", "GRAY")

# OneFlow's interpolation names -> Pillow filters. "auto" is OneFlow's rule: area when shrinking, bilinear when
# growing. Pillow's BOX filter averages the covered source area (OpenCV's INTER_AREA; whole-block shrinks use the
# exact block mean, Image.reduce); its BILINEAR/BICUBIC widen
# their support when shrinking (an antialiased resize, where OpenCV samples a fixed 2x2 / 4x4 neighbourhood).
RESAMPLE = {"bilinear": Image.BILINEAR, "nearest_neighbor": Image.NEAREST, "nn": Image.NEAREST,
            "bicubic": Image.BICUBIC, "area": Image.BOX}
INTERPOLATIONS = ("auto",) + tuple(RESAMPLE)


class ImageDecodeError(ValueError):
    """Bytes that Pillow cannot decode as an image."""


def check_color_space(color_space, api):
    if not isinstance(color_space, str) or color_space.upper() not in COLOR_SPACES:
        raise ValueError(f"{api}: color_space must be one of {', '.join(COLOR_SPACES)}, got {color_space!r}")
    return color_space.upper()


def channels(color_space) -> int:
    return 1 if color_space == "GRAY" else 3


def decode(data: bytes, color_space="BGR", crop=None) -> np.ndarray:
    """Decode an encoded image (JPEG, PNG …) into ``(H, W, 3)`` in ``color_space`` or ``(H, W, 1)`` for GRAY.

    ``crop``, a function ``(H, W) -> (y, x, h, w)``, picks a window of the full image, which alone is converted
    (OneFlow's decoders crop before converting the color). GRAY of a JPEG is its luma plane as libjpeg gives it
    (what OpenCV's ``IMREAD_GRAYSCALE`` returns too).
    """
    try:
        image = Image.open(io.BytesIO(data))
        if color_space == "GRAY" and image.format == "JPEG":
            image.draft("L", image.size)        # same scale, luma straight from the decoder
        image.load()
    except Exception as e:
        raise ImageDecodeError(f"cannot decode {len(data)} bytes as an image ({type(e).__name__}: {e})") from None
    if crop is not None:
        y, x, h, w = crop(image.height, image.width)
        if (y, x, h, w) != (0, 0, image.height, image.width):
            image = image.crop((x, y, x + w, y + h))
    return to_array(image, color_space)


def to_array(image: Image.Image, color_space) -> np.ndarray:
    """A PIL image as ``(H, W, C)`` uint8 in ``color_space``."""
    if color_space == "GRAY":
        if image.mode != "L":
            image = image.convert("L")
        return np.asarray(image)[:, :, None]
    if image.mode != "RGB":
        image = image.convert("RGB")
    array = np.asarray(image)
    return np.ascontiguousarray(array[:, :, ::-1]) if color_space == "BGR" else array


def from_array(array: np.ndarray) -> Image.Image:
    """A ``(H, W, C)`` uint8 array as a PIL image (channel order is kept as it is: resizing does not care)."""
    if array.dtype != np.uint8:
        raise TypeError(f"images must be uint8, got {array.dtype}")
    if array.shape[2] == 1:
        return Image.fromarray(array[:, :, 0], "L")
    return Image.fromarray(array, "RGB")


# --------------------------------------------------------------------------------------------- random crop

class RandomCropWindow:
    """OneFlow's random crop window (``RandomCropGenerator``): an area fraction uniform in ``random_area`` and an
    aspect ratio (w/h) log-uniform in ``random_aspect_ratio``, up to ``num_attempts`` tries for a window inside the
    image; then a fallback window of the largest allowed ratio, scaled down to the largest allowed area; the anchor
    uniform over the positions where the window fits."""

    def __init__(self, num_attempts=10, random_area=(0.08, 1.0), random_aspect_ratio=(0.75, 1.333333),
                 api="random crop"):
        if not isinstance(num_attempts, int) or num_attempts < 1:
            raise ValueError(f"{api}: num_attempts must be an int >= 1, got {num_attempts!r}")
        area, ratio = _range(random_area, "random_area", api), _range(random_aspect_ratio, "random_aspect_ratio", api)
        if area[1] > 1:
            raise ValueError(f"{api}: random_area must lie in (0, 1], got {list(random_area)}")
        self.num_attempts, self.area, self.ratio = num_attempts, area, ratio

    def __call__(self, height, width, rng: np.random.Generator):
        """``(y, x, h, w)`` of a window of an ``height`` x ``width`` image."""
        H, W = height, width
        min_ratio, max_ratio = self.ratio
        min_area = W * H * self.area[0]
        max_w = max(1, int(H * max_ratio))
        max_h = max(1, int(W * (1 / min_ratio)))
        if H * max_w < min_area:
            h, w = H, max_w
        elif W * max_h < min_area:
            h, w = max_h, W
        else:
            log_lo, log_hi = math.log(min_ratio), math.log(max_ratio)
            for _ in range(self.num_attempts):
                target_area = rng.uniform(*self.area) * H * W
                ratio = math.exp(rng.uniform(log_lo, log_hi))
                w = max(1, _round_half_away(math.sqrt(target_area * ratio)))
                h = max(1, _round_half_away(math.sqrt(target_area / ratio)))
                if w <= W and h <= H and min_ratio <= w / h <= max_ratio:
                    break
            else:
                ratio = W / H
                h, w = (H, max_w) if ratio > max_ratio else (max_h, W) if ratio < min_ratio else (H, W)
                scale = min(1.0, self.area[1] * W * H / (h * w))
                h, w = max(1, int(h * math.sqrt(scale))), max(1, int(w * math.sqrt(scale)))
        h, w = min(h, H), min(w, W)
        y = int(rng.integers(0, H - h + 1))
        x = int(rng.integers(0, W - w + 1))
        return y, x, h, w


def _round_half_away(v):
    """C's ``roundf``: halves away from zero."""
    return int(math.floor(v + 0.5))


def _range(value, name, api):
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{api}: {name} must be two numbers [min, max], got {value!r}") from None
    if not 0 < lo <= hi:
        raise ValueError(f"{api}: {name} must satisfy 0 < min <= max, got {list(value)}")
    return lo, hi


# --------------------------------------------------------------------------------------------- resize

def resample_filter(interpolation, src_hw, dst_hw):
    if interpolation == "auto":
        return Image.BILINEAR if dst_hw[0] * dst_hw[1] >= src_hw[0] * src_hw[1] else Image.BOX
    return RESAMPLE[interpolation]


def resize(image: np.ndarray, width, height, interpolation="auto") -> np.ndarray:
    """``image`` resized to ``height`` x ``width`` with Pillow (see ``RESAMPLE``)."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image
    resample = resample_filter(interpolation, (h, w), (height, width))
    if resample == Image.BOX and h % height == 0 and w % width == 0:
        # whole blocks: their exact mean (Pillow's reduce), as OpenCV's INTER_AREA; BOX's fixed point is 1 off
        out = from_array(image).reduce((w // width, h // height))
    else:
        out = from_array(image).resize((width, height), resample)
    array = np.asarray(out)
    return array[:, :, None] if array.ndim == 2 else array


def keep_aspect_size(height, width, target_size, resize_longer, min_size=0, max_size=0):
    """OneFlow's ``image_resize_keep_aspect_ratio`` size rule: ``(new_w, new_h)``. The resized side is
    ``target_size``, the other keeps the aspect ratio (round half to even), bounded by ``max_size`` (shorter mode)
    or ``min_size`` (longer mode)."""
    short, long = min(height, width), max(height, width)
    ratio = short / long
    if resize_longer:
        new_long = float(target_size)
        new_short = float(round(new_long * ratio))
        if min_size > 0 and new_short < min_size:
            new_short = float(min_size)
            new_long = float(round(new_short / ratio))
    else:
        new_short = float(target_size)
        new_long = float(round(new_short / ratio))
        if max_size > 0 and new_long > max_size:
            new_long = float(max_size)
            new_short = float(round(new_long * ratio))
    if width < height:
        return int(new_short), int(new_long)
    return int(new_long), int(new_short)


# --------------------------------------------------------------------------------------------- crop mirror normalize

def crop_offset(size, crop, pos) -> int:
    """OneFlow's crop anchor: ``(size - crop) * pos`` in float32, truncated."""
    return int(np.float32(size - crop) * np.float32(pos))


def normalize_table(mean, inv_std) -> np.ndarray:
    """``(x - mean[c]) * inv_std[c]`` in float32 for every uint8 ``x``: a ``(C, 256)`` lookup table (one gather a
    pixel instead of a cast, a subtraction and a multiplication: ~5x faster, the same float32 values)."""
    levels = np.arange(256, dtype=np.float32)
    return (levels[None, :] - np.asarray(mean, np.float32)[:, None]) * np.asarray(inv_std, np.float32)[:, None]


def crop_mirror_normalize(image: np.ndarray, crop_h, crop_w, pos_y, pos_x, table, layout, mirror=False):
    """One image ``(H, W, C)`` uint8 -> float32 ``(C, crop_h, crop_w)`` (NCHW) or ``(crop_h, crop_w, C)`` (NHWC):
    the crop window at ``(pos_y, pos_x)``, mirrored left-right when ``mirror``, normalized through ``table``
    (``normalize_table``)."""
    H, W, C = image.shape
    y0, x0 = crop_offset(H, crop_h, pos_y), crop_offset(W, crop_w, pos_x)
    window = image[y0:y0 + crop_h, x0:x0 + crop_w]
    if mirror:
        window = window[:, ::-1]
    if layout == "NCHW":
        out = np.empty((C, crop_h, crop_w), np.float32)
        for c in range(C):
            np.take(table[c], window[:, :, c], out=out[c])
        return out
    return table[np.arange(C), window]
