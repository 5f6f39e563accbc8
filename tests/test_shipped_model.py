"""The model shipped in the package (``avsr/pretrained/synthgrid``): it loads by name and reads its example
utterance right, from the Python API and from ``avsr transcribe`` without ``--checkpoint``."""

from __future__ import annotations

import pytest

import avsr
import avsr.pretrained
from avsr.cli import main as avsr_main

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = avsr.pretrained.ROOT / avsr.pretrained.DEFAULT_MODEL
EXAMPLE_WAV, EXAMPLE_MP4 = FOLDER / "example.wav", FOLDER / "example.mp4"


@pytest.fixture(scope="module")
def transcriber():
    return avsr.Transcriber.from_pretrained(avsr.pretrained.DEFAULT_MODEL)


def test_the_shipped_model_has_its_files():
    for name in ("model.pt", "bpe.model", "decode.yaml", "MODEL_CARD.md", "example.wav", "example.mp4",
                 "example.txt"):
        assert (FOLDER / name).is_file(), name
    assert avsr.pretrained.DEFAULT_MODEL in avsr.pretrained.available_models()


def test_the_shipped_model_reads_its_example_in_every_modality(transcriber):
    expected = (FOLDER / "example.txt").read_text().strip()
    assert transcriber(audio=EXAMPLE_WAV).text == expected
    assert transcriber(video=EXAMPLE_MP4, audio=EXAMPLE_WAV).text == expected
    fused = transcriber(video=EXAMPLE_MP4, audio=EXAMPLE_WAV)
    assert fused.modality == "audiovisual" and fused.info["video_trust"] > 0.5  # its own lips: trusted
    assert transcriber(video=EXAMPLE_MP4, modality="video").text == expected


def test_avsr_transcribe_uses_the_shipped_model_without_checkpoint(capsys):
    expected = (FOLDER / "example.txt").read_text().strip()
    assert avsr_main(["transcribe", str(EXAMPLE_WAV)]) == 0
    assert capsys.readouterr().out == f"{EXAMPLE_WAV}\t{expected}\n"
    assert avsr_main(["transcribe", str(EXAMPLE_MP4), "--audio", str(EXAMPLE_WAV)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"\t{expected}")
