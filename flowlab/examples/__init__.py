"""Small, complete programs shipped with flowlab: ``flowlab demo`` runs ``digits_mlp``; ``resnet`` is a ResNet as
OneFlow-Benchmark writes it (its train job is the benchmarks' ResNet-50, and ``resnet.write_run`` the dashboard's
Graph and Health tabs at real size); ``bert`` is a BERT encoder with its pretraining heads as OneFlow-Benchmark writes
it, with learnable pretraining data and its OFRecord writer."""
