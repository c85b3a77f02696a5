"""Summaries: TensorBoard-compatible event files, written and read by flowlab.

``proto`` holds the messages (TensorBoard's names and field numbers), ``record`` the TFRecord framing with CRC-32C.
"""
