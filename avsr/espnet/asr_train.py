"""ESPnet's ASR trainer (``espnet2.bin.asr_train``) with avsr's encoder registered as ``avsr_avhubert``.

Usage: exactly as ESPnet's tool, e.g.::

    python -m avsr.espnet.asr_train --collect_stats true --config conf/train_asr.yaml \\
        --train_data_path_and_name_and_type dump/train/feats.scp,speech,npy \\
        --train_data_path_and_name_and_type dump/train/text,text,text ...
    python -m avsr.espnet.asr_train --config conf/train_asr.yaml --input_size 9320 ...

with ``encoder: avsr_avhubert`` and ``encoder_conf`` of :class:`avsr.espnet.AVHubertESPnetEncoder` in the
configuration; the input is ``python -m avsr.espnet.dump``'s packed frames (``--input_size`` = their
``feats_dim``, ``frontend`` none).
"""

from __future__ import annotations

import sys

from avsr.espnet import register


def main(cmd: list[str] | None = None) -> None:
    """Register the encoder, then run ``espnet2.bin.asr_train.main`` on ``cmd`` (default: ``sys.argv``).

    Raises:
        ImportError: ESPnet is not installed (``bash scripts/install_espnet.sh``).
    """
    register()
    from espnet2.bin.asr_train import main as espnet_main

    espnet_main(cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
