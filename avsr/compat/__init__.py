"""Interoperability with the original AV-HuBERT (fairseq) checkpoints, without fairseq.

* :mod:`avsr.compat.safe_load` -- ``torch.load(weights_only=True)`` with stand-ins for the few fairseq objects
  these files pickle (argparse ``Namespace``, ``Dictionary``, ``SentencepieceBPE``).
* :mod:`avsr.compat.fairseq_config` -- the checkpoint's configuration as avsr options; unsupported fields
  are errors that name the field.
* :mod:`avsr.compat.fairseq_avhubert` -- reading and key mapping (:data:`KEY_RULES`) into a
  :class:`LoadedCheckpoint`, from which ``AVHubertEncoder.from_checkpoint`` / ``AVSRModel.from_checkpoint``
  build the modules (behind their ``from_pretrained``). This package imports no model module, so the
  dependency runs one way: models -> compat.
* :mod:`avsr.compat.dictionary` -- fairseq's target dictionary and the sentencepiece mapping.

The command-line converter is ``avsr-convert`` (:mod:`avsr.bin.convert`).
"""

from avsr.compat.dictionary import FairseqDictionary, FairseqTokenizer
from avsr.compat.fairseq_avhubert import (
    KEY_RULES,
    LoadedCheckpoint,
    load_state_strict,
    read_checkpoint,
    resolve_token_list,
    tokenizer_for,
)
from avsr.compat.fairseq_config import NotAVHubertCheckpointError, UnsupportedConfigError
from avsr.compat.safe_load import CheckpointError, safe_torch_load

__all__ = [
    "CheckpointError",
    "FairseqDictionary",
    "FairseqTokenizer",
    "KEY_RULES",
    "LoadedCheckpoint",
    "NotAVHubertCheckpointError",
    "UnsupportedConfigError",
    "load_state_strict",
    "read_checkpoint",
    "resolve_token_list",
    "safe_torch_load",
    "tokenizer_for",
]
