"""SynthGRID: a small synthetic audio-visual corpus with the GRID grammar, the default corpus of the recipes.

Sentences follow the GRID grammar (:mod:`.grammar`); festival speaks them (:mod:`.festival`) in the voice
and prosody of a speaker (:mod:`.speakers`); the phone timings drive lip, jaw, teeth and tongue trajectories
(:mod:`.visemes`) rendered as a 96x96 gray mouth ROI at 25 fps (:mod:`.render`); :mod:`.utterance` writes
an utterance's files, :mod:`.babble` mixes babble noise, and :mod:`.generate` runs it all in parallel,
resumably (command line: ``python -m avsr.bin.synthgrid``).
"""
