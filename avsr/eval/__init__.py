"""Evaluation: word error rates per test set x modality x noise condition, and the reports made of them.

:mod:`avsr.eval.scoring` reads decode directories (hypotheses and references), computes corpus-level WER
and writes ``results.json``, ``RESULTS.md`` and ``wer_vs_snr.png``. It needs jiwer and matplotlib and is
imported on demand (``from avsr.eval.scoring import ...``).
"""
