"""Small, complete programs shipped with flowlab: ``flowlab demo`` runs ``digits_mlp``; ``resnet`` is a ResNet as
OneFlow-Benchmark writes it (its train job is the benchmarks' ResNet-50, and ``resnet.write_run`` the dashboard's
Graph and Health tabs at real size); ``bert`` is a BERT encoder with its pretraining heads, with learnable
pretraining data and its OFRecord writer; ``dcgan`` a GAN of transposed convolutions and ``wide_deep`` a Wide & Deep
click model with sparse embedding updates; all as OneFlow-Benchmark writes them."""
