"""SynthGRID voices: phone maps, diphone coverage, HTS warping, and every voice speaking GRID sentences."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from avsr.corpora.synthgrid import grammar
from avsr.corpora.synthgrid.festival import SynthRequest, festival_available, read_mapped_segs, synthesize
from avsr.corpora.synthgrid.voices import (
    ENGLISH_PHONES,
    ENGLISH_PRONUNCIATIONS,
    LEGACY_VOICES,
    TRAIN_VOICES,
    UNSEEN_VOICES,
    VOICES,
    apply_repairs,
    diphone_inventory,
    diphone_repairs,
    htsvoice_alpha,
    installed_voices,
    sentence_phones,
    warp_htsvoice,
)

INSTALLED = installed_voices() if festival_available() else []
needs_voices = pytest.mark.skipif(
    not festival_available() or set(INSTALLED) != set(VOICES),
    reason="festival and every voice of avsr.corpora.synthgrid.voices (bash scripts/install.sh)",
)


def test_every_map_covers_the_english_phone_set():
    for v in VOICES.values():
        if v.phone_map is None:
            continue
        v.phone_map.check()
        assert set(v.phone_map.stressed) <= set(ENGLISH_PHONES)
        assert v.phone_map.target("pau"), v.name  # a pause phone of the voice
    assert set(LEGACY_VOICES) <= set(TRAIN_VOICES) and not set(UNSEEN_VOICES) & set(TRAIN_VOICES)
    assert set(TRAIN_VOICES) | set(UNSEEN_VOICES) == set(VOICES)


def test_pronunciations_cover_the_vocabulary_in_english_phones():
    assert set(ENGLISH_PRONUNCIATIONS) == set(grammar.VOCABULARY)
    for word, phones in ENGLISH_PRONUNCIATIONS.items():
        assert phones and all(p in ENGLISH_PHONES for p, _ in phones), word


def test_phone_map_stress_and_scheme():
    italian = VOICES["lp_diphone"].phone_map
    assert italian.target("ay") == ("a", "i") and italian.target("ay", stressed=True) == ("a1", "i")
    assert italian.target("hh") == ()  # dropped
    assert italian.map([("b", True), ("iy", True)]) == ["b", "i1"]
    scheme = italian.scheme()
    assert scheme.startswith("'((") and '("ay" ("a" "i") ("a1" "i"))' in scheme and '("hh" ())' in scheme


def test_apply_repairs_inserts_and_substitutes_in_passes():
    repairs = {"t-d": ("first", "d"), "d-d": ("insert", "#"), "u-e": ("insert", "j")}
    assert apply_repairs(["a", "t", "d", "u", "e"], repairs) == ["a", "d", "#", "d", "u", "j", "e"]


def test_htsvoice_warping_changes_only_the_alpha():
    header = b"[GLOBAL]\nOPTION[MCP]:ALPHA=0.420000\n[POSITION]\nX:0-10\n[DATA]\n" + bytes(range(40))
    warped = warp_htsvoice(header, 0.38)
    assert len(warped) == len(header) and htsvoice_alpha(warped) == pytest.approx(0.38)
    assert warped.replace(b"0.380000", b"0.420000") == header
    short = b"OPTION[MCP]:ALPHA=0.45\n"
    assert warp_htsvoice(short, 0.5) == b"OPTION[MCP]:ALPHA=0.50\n"
    with pytest.raises(ValueError, match="alpha"):
        warp_htsvoice(short, 1.2)
    with pytest.raises(ValueError, match="ALPHA"):
        warp_htsvoice(b"no header", 0.4)


@needs_voices
@pytest.mark.festival
@pytest.mark.parametrize("name", sorted(n for n, v in VOICES.items() if v.engine == "diphone" and v.phone_map
                                         is not None))
def test_every_grid_diphone_exists_after_repairs(name):
    """No GRID sentence of a mapped diphone voice needs a diphone its database lacks (festival would put
    silence in its place)."""
    v = VOICES[name]
    inventory = diphone_inventory(name)
    repairs = diphone_repairs(v.phone_map, inventory)
    rng = np.random.default_rng(0)
    for _ in range(1500):
        words = grammar.sample_sentence(rng)
        seq = apply_repairs(sentence_phones(words, v.phone_map), repairs)
        missing = [f"{a}-{b}" for a, b in zip(seq, seq[1:]) if f"{a}-{b}" not in inventory]
        assert not missing, (words, missing)


@needs_voices
@pytest.mark.festival
def test_every_target_phone_is_in_the_voice_phone_set():
    """Festival's own phone set of each voice holds every phone of its map, stress variants and
    substitutes."""
    mapped = [v for v in VOICES.values() if v.phone_map is not None]
    script = "".join(
        f"(voice_{v.name})\n(format t \"PS {v.name} %l\\n\" "
        "(mapcar car (cadr (assoc 'phones (PhoneSet.description '(phones))))))\n"
        for v in mapped
    )
    out = subprocess.run(["festival", "--pipe"], input=script, capture_output=True, text=True, timeout=120)
    sets = {line.split()[1]: set(line.split(" ", 2)[2].strip("()").split())
            for line in out.stdout.splitlines() if line.startswith("PS ")}
    assert set(sets) == {v.name for v in mapped}, out.stderr[-2000:]
    for v in mapped:
        pm = v.phone_map
        used = {t for s in [*pm.phones.values(), *pm.stressed.values(), *pm.alternatives.values()]
                for t in s.split()} | set(pm.fillers)
        assert used <= sets[v.name], (v.name, used - sets[v.name])


SENTENCES = [
    ("BIN", "BLUE", "AT", "F", "TWO", "NOW"),
    ("PLACE", "WHITE", "WITH", "Q", "ZERO", "PLEASE"),
    ("SET", "GREEN", "BY", "H", "SEVEN", "AGAIN"),
]


@needs_voices
@pytest.mark.festival
@pytest.mark.parametrize("name", sorted(VOICES))
def test_every_voice_speaks_grid_sentences_word_by_word(name):
    """Each voice says every word of a GRID sentence: its English phone segments are the words'
    pronunciations in order (six words), and every word is audible speech of plausible length."""
    requests = [SynthRequest(f"u{i}", grammar.festival_text(w), name) for i, w in enumerate(SENTENCES)]
    for words, result in zip(SENTENCES, synthesize(requests)):
        segments = [s for s in result.segments if s[2] != "pau"]
        expected = [p for w in words for p, _ in ENGLISH_PRONUNCIATIONS[w]]
        assert [p for _, _, p in segments] == expected, (name, words)
        wav = result.wav.astype(np.float64)
        level = np.sqrt(np.mean(wav**2))
        i = 0
        spans = []
        for w in words:
            n = len(ENGLISH_PRONUNCIATIONS[w])
            spans.append((segments[i][0], segments[i + n - 1][1]))
            i += n
        assert len(spans) == 6
        for w, (start, end) in zip(words, spans):
            assert 0.05 < end - start < 1.2, (name, w, end - start)
            part = wav[int(start * 16000) : int(end * 16000)]
            assert np.sqrt(np.mean(part**2)) > 0.1 * level, (name, w)  # spoken, not a silent gap
        assert abs(len(result.wav) / 16000 - result.segments[-1][1]) < 0.15


@needs_voices
@pytest.mark.festival
def test_hts_alpha_moves_the_formants_and_keeps_the_timing():
    text = grammar.festival_text(SENTENCES[0])
    out = synthesize([SynthRequest(f"a{i}", text, "cmu_us_slt_arctic_hts", alpha=a)
                      for i, a in enumerate((0.39, 0.45, 0.51))])

    def centroid(x):
        spectrum = np.abs(np.fft.rfft(x)) ** 2
        return float((spectrum * np.fft.rfftfreq(len(x), 1 / 16000)).sum() / spectrum.sum())

    c = [centroid(r.wav) for r in out]
    assert c[0] > c[1] > c[2]  # a smaller all-pass constant: a shorter vocal tract, higher formants
    assert len({len(r.wav) for r in out}) == 1 and out[0].segments == out[2].segments


def test_mapped_segment_files_merge_into_english_phones(tmp_path):
    path = tmp_path / "0.segs"
    path.write_text("0.2 # pau 0\n0.3 b b 1\n0.35 a ay 2\n0.4 i ay 2\n0.42 # ay 2\n0.5 t t 3\n0.7 # pau 4\n")
    assert read_mapped_segs(path, "u") == [
        (0.0, 0.2, "pau"), (0.2, 0.3, "b"), (0.3, 0.42, "ay"), (0.42, 0.5, "t"), (0.5, 0.7, "pau")
    ]


def test_install_script_installs_every_voice_package():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "scripts" / "install.sh").read_text()
    debs = set(text.split("debs=(", 1)[1].split(")", 1)[0].split())
    assert debs == {"festival", "espeak-ng", "flite"} | {v.package for v in VOICES.values()}
    assert not any("mbrola" in d or "rhvoice" in d or "pico" in d for d in debs)
