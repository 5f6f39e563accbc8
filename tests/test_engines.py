"""SynthGRID's other synthesisers: eSpeak NG and flite speak GRID sentences with phone and word timings, every
voice of the catalogue, and corpora with several engines are deterministic per utterance id."""

from __future__ import annotations

import hashlib
import subprocess

import numpy as np
import pytest

from avsr.corpora.synthgrid import engines, espeak, flite
from avsr.corpora.synthgrid.engines import (
    ESPEAK_ACCENTS,
    ESPEAK_UNSEEN_VARIANTS,
    ESPEAK_VARIANTS,
    FLITE_UNSEEN_VOICES,
    FLITE_VOICES,
    EngineRequest,
    engine_voices,
    parse_voice_key,
    synthesize_one,
    voice_key,
)
from avsr.corpora.synthgrid.grammar import SLOTS
from avsr.corpora.synthgrid.visemes import PHONE_TO_VISEMES

needs_espeak = pytest.mark.skipif(not espeak.espeak_available(),
                                  reason="eSpeak NG (Debian package espeak-ng: bash scripts/install.sh)")
needs_flite = pytest.mark.skipif(not flite.flite_available(),
                                 reason="flite (Debian package flite: bash scripts/install.sh)")

SENTENCE = ("BIN", "BLUE", "AT", "A", "TWO", "NOW")  # the letter A: both engines misread a lone capital A
OTHER = ("PLACE", "WHITE", "WITH", "Q", "ZERO", "PLEASE")


def check_synthesis(result, words, name):
    """16 kHz non-silent audio of plausible length; phone segments contiguous, monotonic, covering the audio,
    all with a viseme; six words in order inside the speech, each audible."""
    wav, segments = result.wav, result.segments
    duration = wav.shape[0] / 16000
    assert wav.dtype == np.float32 and wav.ndim == 1, name
    assert 0.7 < duration < 5.0, (name, duration)
    assert segments[0][0] == 0.0 and abs(segments[-1][1] - duration) < 0.02, (name, segments[-1], duration)
    for (_, e0, _), (s1, e1, _) in zip(segments, segments[1:]):
        assert e0 == pytest.approx(s1, abs=1e-9) and s1 <= e1, name
    assert all(p in PHONE_TO_VISEMES for _, _, p in segments), name
    assert segments[0][2] == "pau" and segments[-1][2] == "pau", name
    assert len(result.words) == len(words) == 6, (name, result.words)
    level = np.sqrt(np.mean(wav.astype(np.float64) ** 2))
    assert level > 1e-3, name
    for (start, end), (next_start, _) in zip(result.words, result.words[1:] + [(duration, None)]):
        assert 0.0 < start < end <= next_start + 1e-9, (name, result.words)
        part = wav[int(start * 16000) : int(end * 16000)].astype(np.float64)
        assert np.sqrt(np.mean(part**2)) > 0.05 * level, (name, start, end)


def test_voice_keys_round_trip_and_reject_unknown_voices():
    assert parse_voice_key("kal_diphone") == ("festival", "kal_diphone", None)
    assert parse_voice_key(voice_key("espeak-ng", "en-gb-scotland", "m3")) == ("espeak-ng", "en-gb-scotland",
                                                                                "m3")
    assert parse_voice_key("espeak-ng:en-us") == ("espeak-ng", "en-us", None)
    assert parse_voice_key("flite:slt") == ("flite", "slt", None)
    for bad in ("espeak-ng:en-xx", "espeak-ng:en+nosuch", "flite:awb_time", "mbrola:us1"):
        with pytest.raises(ValueError):
            parse_voice_key(bad)


def test_held_out_voices_are_in_no_training_voice():
    train = set(engine_voices("espeak-ng")) | set(engine_voices("flite"))
    unseen = set(engine_voices("espeak-ng", unseen=True)) | set(engine_voices("flite", unseen=True))
    assert not train & unseen
    variants = {parse_voice_key(k)[2] for k in train if k.startswith("espeak-ng")}
    assert variants == set(ESPEAK_VARIANTS) - set(ESPEAK_UNSEEN_VARIANTS)  # every training variant is used
    assert {parse_voice_key(k)[1] for k in unseen if k.startswith("flite")} == set(FLITE_UNSEEN_VOICES)
    assert not any("mb-" in str(v) or "mbrola" in str(v) for v in [*ESPEAK_ACCENTS, *ESPEAK_VARIANTS])


def test_voice_catalogue_document_is_up_to_date():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "recipes/synthgrid/avsr1/local/VOICES.md"
    regenerate = "regenerate it: python -m avsr.bin.synthgrid --list-voices"
    assert path.read_text() == engines.catalogue_markdown(), regenerate
    descriptions = [*ESPEAK_ACCENTS.values(), *ESPEAK_VARIANTS.values(), *FLITE_VOICES.values()]
    assert all(d.strip() for d in descriptions)


def test_ipa_maps_onto_festival_phones():
    assert espeak.ipa_to_phones("") == ["pau"] and espeak.ipa_to_phones("_") == ["pau"]
    assert espeak.ipa_to_phones("tʃ") == ["ch"] and espeak.ipa_to_phones("ɡ") == ["g"]
    assert espeak.ipa_to_phones("eɪ") == ["ey"] and espeak.ipa_to_phones("eː") == ["ey"]
    assert espeak.ipa_to_phones("iə") == ["iy", "ax"]  # no US counterpart: two vowels
    assert espeak.ipa_to_phones("ɑːɹ") == ["aa", "r"] and espeak.ipa_to_phones("t̪") == ["t"]
    with pytest.raises(espeak.EspeakError, match="ʘ"):
        espeak.ipa_to_phones("ʘ")


def test_espeak_events_become_contiguous_segments_and_words():
    # word "bin" (b 0-100, ɪ 100-300, n 300-400), word "now" (n 400-500, aʊ 500-900), pause to 1000
    events = [(1, 0, ""), (7, 0, "b"), (7, 100, "ɪ"), (7, 300, "n"), (1, 400, ""), (7, 400, "n"),
              (7, 500, "aʊ"), (7, 900, ""), (5, 1000, "")]
    segments, words = espeak.segments_from_events(events, 1000, 1000)
    assert segments == [(0.0, 0.1, "b"), (0.1, 0.3, "ih"), (0.3, 0.4, "n"), (0.4, 0.5, "n"), (0.5, 0.9, "aw"),
                        (0.9, 1.0, "pau")]
    assert words == [(0.0, 0.4), (0.4, 0.9)]


def test_flite_segments_and_word_spans():
    segments = flite.parse_psdur("pau:0.2 b:0.3 ih:0.35 n:0.4 n:0.5 aw:0.7 pau:0.9")
    assert segments[0] == (0.0, 0.2, "pau") and segments[-1] == (0.7, 0.9, "pau")
    assert flite.word_spans(segments, ("BIN", "NOW")) == [(0.2, 0.4), (0.4, 0.7)]
    with pytest.raises(ValueError, match="NINE"):
        flite.word_spans(segments, ("BIN", "NINE"))


def test_engine_text_spells_the_letter_a_for_each_engine():
    assert engines.engine_text("espeak-ng", SENTENCE) == "bin blue at eigh two now"
    assert engines.engine_text("flite", SENTENCE) == "bin blue at ay two now"
    assert engines.engine_text("flite", OTHER) == "place white with Q zero please"


@needs_espeak
@pytest.mark.parametrize("accent", sorted(ESPEAK_ACCENTS))
def test_every_espeak_accent_speaks_grid_sentences(accent):
    for words in (SENTENCE, OTHER):
        check_synthesis(synthesize_one(EngineRequest("u", words, "espeak-ng", accent)), words, accent)


@needs_espeak
def test_every_espeak_variant_speaks_a_grid_sentence():
    """All variants (about 100, 20 ms each), each with another accent and prosody."""
    assert set(espeak.installed_variants()) == {v for v in ESPEAK_VARIANTS if v}
    accents = sorted(ESPEAK_ACCENTS)
    for i, variant in enumerate(ESPEAK_VARIANTS):
        request = EngineRequest("u", SENTENCE if i % 2 else OTHER, "espeak-ng", accents[i % len(accents)],
                                variant, rate=0.8 + 0.45 * (i % 5) / 4, pitch=25 + i % 51,
                                pitch_range=20 + (7 * i) % 61, tape=0.9 + 0.2 * (i % 3) / 2)
        check_synthesis(synthesize_one(request), request.words, variant)


@needs_espeak
def test_espeak_lists_the_catalogued_english_voices():
    out = subprocess.run(["espeak-ng", "--voices=en"], capture_output=True, text=True, check=True).stdout
    files = {line.split()[4].split("/", 1)[1].lower() for line in out.splitlines()[1:] if "gmw/" in line}
    assert files == set(ESPEAK_ACCENTS)


@needs_espeak
def test_espeak_rate_pitch_and_tape_change_the_audio():
    base = synthesize_one(EngineRequest("u", SENTENCE, "espeak-ng", "en-us", "m3"))
    fast = synthesize_one(EngineRequest("u", SENTENCE, "espeak-ng", "en-us", "m3", rate=1.25))
    high = synthesize_one(EngineRequest("u", SENTENCE, "espeak-ng", "en-us", "m3", pitch=80))
    assert len(fast.wav) < 0.9 * len(base.wav)
    assert not np.array_equal(base.wav, high.wav)
    again = synthesize_one(EngineRequest("u", SENTENCE, "espeak-ng", "en-us", "m3"))
    assert np.array_equal(base.wav, again.wav) and base.segments == again.segments  # deterministic
    with pytest.raises(engines.EngineError, match="variant"):
        synthesize_one(EngineRequest("u", SENTENCE, "espeak-ng", "en-us", "nosuch"))


@needs_flite
@pytest.mark.parametrize("voice", sorted(FLITE_VOICES))
def test_every_flite_voice_speaks_a_grid_sentence(voice):
    request = EngineRequest("u", SENTENCE, "flite", voice, rate=1.1, f0_mean=120.0, f0_std=15.0, tape=1.05)
    result = synthesize_one(request)
    check_synthesis(result, SENTENCE, voice)
    if voice == "kal":  # 8 kHz upsampled: nothing above 4 kHz
        spectrum = np.abs(np.fft.rfft(result.wav)) ** 2
        freqs = np.fft.rfftfreq(len(result.wav), 1 / 16000)
        assert spectrum[freqs > 4100].sum() < 1e-3 * spectrum.sum()


@pytest.mark.festival
@needs_espeak
@needs_flite
def test_corpus_with_every_engine_is_deterministic_per_utterance(tmp_path):
    from avsr.corpora.synthgrid.festival import festival_available
    from avsr.corpora.synthgrid.generate import SynthGridConfig, generate

    if not festival_available():
        pytest.skip("festival (Debian package festival: bash scripts/install.sh)")
    config = SynthGridConfig(num_train=6, num_valid=0, num_test=0, train_speakers=6, babble_seconds=0.0,
                             engines=("festival", "espeak-ng", "flite"), num_test_espeak_ng=2,
                             num_test_flite=1, test_engine_speakers=2, train_corpus="voices", nuisance=0.0)
    speakers = {s.id: s for s in config.speakers()}
    train = [s for s in speakers.values() if s.split == "train"]
    assert [s.engine for s in train] == ["festival", "espeak-ng", "flite"] * 2
    assert len({(s.engine, s.voice, s.variant) for s in train}) == 6  # different ids: different speakers
    assert speakers["tr001"].to_dict()["engine"] == "espeak-ng"
    assert "engine" not in speakers["tr000"].to_dict()  # festival speakers' records as before
    unseen = [s for s in speakers.values() if s.split in ("test_espeak_ng", "test_flite")]
    assert {s.variant for s in unseen if s.engine == "espeak-ng"} <= set(ESPEAK_UNSEEN_VARIANTS)
    assert {s.voice for s in unseen if s.engine == "flite"} == set(FLITE_UNSEEN_VOICES)

    def digests(root):
        return {p.relative_to(root).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.suffix in (".wav", ".mp4", ".txt", ".phn")
                and p.name != "lexicon.txt"}

    generate(tmp_path / "a", config, nj=1, progress=False)
    first = digests(tmp_path / "a")
    assert len(first) == 4 * 9
    assert {k.split("/")[0] for k in first} == {"train", "test_espeak_ng", "test_flite"}
    # the same utterance ids in smaller batches (another order of work): identical bytes
    generate(tmp_path / "b", config, nj=1, batch_size=1, progress=False)
    assert digests(tmp_path / "b") == first
    # a train utterance of a speaker's engine speaks with its timings: segments cover the wav
    for phn in (tmp_path / "a").rglob("*.phn"):
        rows = [line.split() for line in phn.read_text().splitlines()]
        assert float(rows[0][0]) == 0.0 and all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


@needs_flite
@pytest.mark.parametrize("voice", sorted(FLITE_VOICES))
def test_every_flite_voice_says_every_grid_word_with_known_phones(voice):
    """25 GRID sentences that together hold every word of every slot, synthesised as the corpus does it
    (``synthesize_one``: the engine's text, the voice's own pronunciations in VOICE_PRONUNCIATIONS): each
    gives its six word spans, so no training utterance of any voice fails on a word."""
    for i in range(max(map(len, SLOTS))):
        words = tuple(slot[i % len(slot)] for slot in SLOTS)
        result = synthesize_one(EngineRequest(f"u{i}", words, "flite", voice))
        assert len(result.words) == 6, (voice, words)
