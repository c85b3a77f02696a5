#!/usr/bin/env bash
# Regenerate descriptors.pb from record.proto (needs grpcio-tools: pip install grpcio-tools).
# flowlab loads it into a private descriptor pool (see __init__.py), so its "oneflow.*" messages never clash with
# OneFlow's own generated modules in the same process.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
python -m grpc_tools.protoc -I . --include_imports --descriptor_set_out=flowlab/data/proto/descriptors.pb \
  flowlab/data/proto/*.proto
