"""``flow.image``: OneFlow 0.x's image ops on decoded images of a ``flow.data`` reader (see ``flowlab.data.ops``)."""
from .data.ops import CropMirrorNormalize, Resize

resize = Resize
crop_mirror_normalize = CropMirrorNormalize

__all__ = ["CropMirrorNormalize", "Resize", "crop_mirror_normalize", "resize"]
