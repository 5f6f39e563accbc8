"""Decoding: batched joint CTC/attention beam search, CTC prefix scoring, greedy CTC; scoring (WER) lives in
:mod:`avsr.eval.scoring` (imported on demand: it needs jiwer and matplotlib)."""

from avsr.decode.beam_search import Hypothesis, JointSearch, batch_beam_search, ctc_greedy_decode
from avsr.decode.config import DecodeConfig, FairseqConfig, SearchConfig, load_decode_config, search_config
from avsr.decode.ctc_prefix_score import CTCPrefixScorer, CTCPrefixState, ctc_expected_label_count

__all__ = [
    "CTCPrefixScorer",
    "CTCPrefixState",
    "DecodeConfig",
    "FairseqConfig",
    "Hypothesis",
    "JointSearch",
    "SearchConfig",
    "batch_beam_search",
    "ctc_expected_label_count",
    "ctc_greedy_decode",
    "load_decode_config",
    "search_config",
]
