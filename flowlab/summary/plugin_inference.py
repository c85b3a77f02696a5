"""Which plugin (so which kind of item) a tag's values belong to.

A tensor value's meaning comes from its tag's plugin, fixed per run by the first metadata seen, as TensorBoard's
``EventAccumulator`` fixes it (``tag_plugin``). Most writers send metadata only with a tag's first value, so when
that record is damaged TensorBoard loses the whole tag; here the tag takes the plugin another run gave it, else one
inferred from its value (``infer_plugin``), until real metadata arrives.
"""
from __future__ import annotations

from .decode import DTYPES, LEGACY


def tag_plugin(run, tag_plugins, tag, field, v) -> tuple[str, bytes]:
    """``(plugin, content)`` of the ``Summary.Value`` ``v`` (``field``: which of its oneof fields it holds) under
    ``tag`` in ``run``, a table of ``plugins`` {tag: (plugin, content)} with ``inferred`` tags and ``set_plugin``,
    which this fixes as it goes. ``tag_plugins`` {tag: (plugin, content)}: metadata any run gave (not hparams)."""
    legacy = LEGACY.get(field)
    known = run.plugins.get(tag)
    if legacy:                              # TensorBoard's data_compat gives these their plugin's metadata
        return known or run.set_plugin(tag, legacy[1], b"")
    own = v.metadata.plugin_data if v.HasField("metadata") else None
    if own is not None and own.plugin_name and (known is None or tag in run.inferred):
        # The first metadata seen fixes the tag's plugin, as in TensorBoard; it also replaces an inference.
        plugin, content = run.set_plugin(tag, own.plugin_name, own.content)
        if own.plugin_name != "hparams":
            tag_plugins.setdefault(tag, (own.plugin_name, own.content))
    elif known is not None:
        plugin, content = known
    else:
        # No metadata yet: the tag's first record (the only one carrying it, for most writers) was damaged or lost.
        # TensorBoard then never shows the tag; we take the plugin another run gave the same tag, else infer it
        # from the value, until real metadata comes.
        plugin, content = run.set_plugin(tag, *(tag_plugins.get(tag) or (infer_plugin(v), b"")), inferred=True)
    if plugin == "hparams" and own is not None:
        content = own.content               # hparams values each carry their own data in the metadata
    return plugin, content


# -- a value's plugin when no metadata says it ---------------------------------------------------------------
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
_STRING, _FLOATS = 7, frozenset({1, 2, 19})           # DataType numbers: DT_STRING; DT_FLOAT, DT_DOUBLE, DT_HALF


def _is_image(data: bytes) -> bool:
    return data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def infer_plugin(value) -> str:
    """The plugin a ``Summary.Value`` without metadata most likely belongs to, from its tensor's dtype and shape as
    TensorBoard's plugins write them: a rank-0 number -> "scalars"; a float [k, 3] -> "histograms" (left, right,
    count rows); a string vector [width, height, encoded images...] -> "images"; a string [k, 2] of WAV clips and
    labels -> "audio"; any other string tensor -> "text"; anything else -> "" (a plain tensor)."""
    if value.WhichOneof("value") != "tensor":
        return ""
    t = value.tensor
    shape = [d.size for d in t.tensor_shape.dim]
    if t.dtype == _STRING:
        strings = t.string_val
        if (len(shape) == 1 and shape[0] >= 3 and len(strings) == shape[0] and strings[0].isdigit()
                and strings[1].isdigit() and all(_is_image(x) for x in strings[2:])):
            return "images"
        if (len(shape) == 2 and shape[1] == 2 and shape[0] >= 1 and len(strings) == 2 * shape[0]
                and all(x[:4] == b"RIFF" and x[8:12] == b"WAVE" for x in strings[::2])):
            return "audio"
        return "text"
    if t.dtype not in DTYPES:
        return ""
    if not shape:
        return "scalars"
    if len(shape) == 2 and shape[1] == 3 and t.dtype in _FLOATS:
        return "histograms"
    return ""
