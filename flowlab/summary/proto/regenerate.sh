#!/usr/bin/env bash
# Regenerate descriptors.pb from the .proto files (needs grpcio-tools: pip install grpcio-tools).
# flowlab loads it into a private descriptor pool (see __init__.py), so its "tensorboard.*" messages never clash
# with TensorBoard's or TensorFlow's own generated modules in the same process.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
python -m grpc_tools.protoc -I . --include_imports --descriptor_set_out=flowlab/summary/proto/descriptors.pb \
  flowlab/summary/proto/*.proto
