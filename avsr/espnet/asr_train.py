"""ESPnet's ASR trainer (``espnet2.bin.asr_train``) with avsr's encoder registered as ``avsr_avhubert``.

Usage: exactly as ESPnet's tool, e.g.::

    python -m avsr.espnet.asr_train --collect_stats true --config conf/train_asr.yaml \\
        --train_data_path_and_name_and_type dump/train/feats.scp,speech,npy \\
        --train_data_path_and_name_and_type dump/train/text,text,text ...
    python -m avsr.espnet.asr_train --config conf/train_asr.yaml --input_size 9320 ...

with ``encoder: avsr_avhubert`` and ``encoder_conf`` of :class:`avsr.espnet.AVHubertESPnetEncoder` in the
configuration; the input is ``python -m avsr.espnet.dump``'s packed frames (``--input_size`` = their
``feats_dim``, ``frontend`` none).

Before ESPnet starts, :func:`prepare_process` makes the process compute as avsr's own trainer does
(:class:`avsr.train.trainer.Trainer`): subnormal floats flushed to zero and glibc's malloc keeping freed
memory, so that both trainers run the same model under the same CPU settings
(``recipes/synthgrid/asr1_espnet/RESULTS.md`` compares their epochs).
"""

from __future__ import annotations

import logging
import sys

from avsr.espnet import register

__all__ = ["prepare_process", "main"]

logger = logging.getLogger(__name__)


def prepare_process(flush_denormals: bool = True, keep_memory: bool = True) -> dict[str, bool]:
    """Set the process-wide CPU settings of avsr's trainer; call it before any parallel torch operation.

    * ``flush_denormals``: subnormal float32/bfloat16 values are treated as zero on the CPU
      (:func:`avsr.nn.precision.flush_denormal`, FTZ/DAZ). The flag is per thread and inherited by threads
      created afterwards, so it must be set before torch starts its intra-op worker threads -- before ESPnet
      builds the model -- for the whole step to run with it.
    * ``keep_memory``: glibc's malloc keeps freed memory for reuse instead of returning it to the kernel
      (:func:`avsr.memory.keep_freed_memory`), so the step's large activation buffers are not
      zero-filled by the kernel again on every step.

    Neither changes a result beyond float rounding (a subnormal is below 1.2e-38). Returns which settings
    took effect: ``{"flush_denormal": bool, "keep_freed_memory": bool}`` (False where the CPU or the C
    library does not support it, or where not asked).
    """
    from avsr.memory import keep_freed_memory
    from avsr.nn.precision import flush_denormal

    done = {
        "flush_denormal": bool(flush_denormals) and flush_denormal(True),
        "keep_freed_memory": bool(keep_memory) and keep_freed_memory(),
    }
    logger.info("avsr.espnet.asr_train: %s", ", ".join(f"{k} {v}" for k, v in done.items()))
    return done


def main(cmd: list[str] | None = None) -> None:
    """Prepare the process (:func:`prepare_process`), register the encoder, then run
    ``espnet2.bin.asr_train.main`` on ``cmd`` (default: ``sys.argv``).

    Raises:
        ImportError: ESPnet is not installed (``bash scripts/install_espnet.sh``).
    """
    prepare_process()
    register()
    from espnet2.bin.asr_train import main as espnet_main

    espnet_main(cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
