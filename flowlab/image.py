"""``flow.image``: OneFlow 0.x's image ops on decoded images of a ``flow.data`` reader (see ``flowlab.data.ops``)."""
from .data.ops import CropMirrorNormalize, Resize, image_decode, image_random_crop, target_resize

resize = Resize
crop_mirror_normalize = CropMirrorNormalize
decode = image_decode
random_crop = image_random_crop

__all__ = ["CropMirrorNormalize", "Resize", "crop_mirror_normalize", "decode", "random_crop", "resize",
           "target_resize"]
