"""Neural-network building blocks of avsr (one concept per module).

* :mod:`avsr.nn.resnet` -- the AV-HuBERT video front-end (3-D stem + ResNet-18 trunk + projection).
* :mod:`avsr.nn.transformer` -- the wav2vec 2.0 / AV-HuBERT transformer encoder (conv positional embedding,
  pre-/post-LN layers, attention via ``scaled_dot_product_attention``).
* :mod:`avsr.nn.decoder` -- the attention decoder of the ASR model.
* :mod:`avsr.nn.masking` -- span masks and input masking for masked cluster prediction (pretraining).

Import the classes from their modules (``from avsr.nn.transformer import TransformerEncoder``); this package
file imports nothing so that importing one block stays light.
"""
