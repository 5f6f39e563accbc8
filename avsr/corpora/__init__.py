"""Corpus makers: programs that make the data the recipes train and test on, apart from the data layer
(:mod:`avsr.data`, which reads data dirs and media for training and decoding).

:mod:`avsr.corpora.synthgrid` generates SynthGRID: GRID-grammar sentences spoken by open synthesisers
(festival, espeak-ng, flite), with mouth videos rendered from their phone timings, augmentation, babble noise
and the per-slot reports of its test sets.
"""
