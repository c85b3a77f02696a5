"""Summaries: TensorBoard-compatible event files, written and read by flowlab.

``proto`` holds the messages (TensorBoard's names and field numbers), ``record`` the TFRecord framing with CRC-32C,
``encode`` builds ``Summary.Value``s in TensorBoard's current encodings and ``writer.EventFileWriter`` writes them
on a background thread. On top of these, two ways to write:

* OneFlow 0.x's API (``flow.summary.*``, see ``oneflow_api``): in-job ops ``create_summary_writer``, ``scalar``,
  ``histogram``, ``image``, ``pb``, ``flush_summary_writer``; helpers ``text`` and ``hparams`` (with ``HParam``,
  ``RealRange``, ``IntegerRange``, ``ValueSet``, ``Metric``); ``Graph(logdir).write_structure_graph()``
  (``graph_export``); ``Projector(logdir)`` for embeddings and exception samples (``projector``, which also reads
  them back with ``read_projector``).
* PyTorch's ``SummaryWriter`` (``summary_writer``).

Reading: ``read_scalars``, ``read_histograms``, ``read_images``, ``read_text``, ``read_tensors``, ``read_hparams``,
``read_health``, ``read_graphs`` (``reader``) give a logdir's data at once; ``LogdirTailer`` (``tailer``) follows it
as it grows, and ``LogdirProvider`` (``provider``), the one reader behind the dashboard, adds the run assets
(projector configs, structure graphs) and TensorBoard-style queries with downsampling. The tailer reads through
``logdir_files`` (finding and reading files, local or fsspec), ``framing`` (records and damage),
``decode`` (records as items) and ``plugin_inference`` (which plugin a tag is).
"""
from .hparams import HParam, IntegerRange, Metric, RealRange, ValueSet, hparams
from .oneflow_api import (Graph, NoSummaryWriterError, close_summary_writer, create_summary_writer,
                          flush_summary_writer, histogram, image, pb, scalar, text)
from .projector import Projector, read_projector, write_embedding
from .summary_writer import SummaryWriter
from .provider import LogdirProvider
from .reader import (LogdirTailer, read_graphs, read_health, read_histograms, read_hparams, read_images, read_scalars,
                     read_tensors, read_text)

__all__ = [
    "SummaryWriter", "create_summary_writer", "scalar", "histogram", "image", "pb", "text", "hparams", "HParam",
    "RealRange", "IntegerRange", "ValueSet", "Metric", "flush_summary_writer", "close_summary_writer",
    "NoSummaryWriterError", "Graph", "Projector", "read_projector", "write_embedding", "read_scalars",
    "read_histograms", "read_images", "read_text", "read_tensors", "read_hparams", "read_health", "read_graphs",
    "LogdirTailer",
]
