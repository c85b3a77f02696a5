"""Small, complete programs shipped with flowlab (``flowlab demo`` runs ``digits_mlp``; ``resnet50`` is a
ResNet-50-shaped train job with OneFlow-Benchmark's names, for the dashboard's Graph and Health tabs at real size)."""
