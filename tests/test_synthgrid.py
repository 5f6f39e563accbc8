"""SynthGRID: grammar, viseme rendering, festival synthesis, corpus generation (layout, resume, speakers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from avsr.corpora.synthgrid import grammar
from avsr.corpora.synthgrid.festival import FestivalError, SynthRequest, festival_available, synthesize
from avsr.corpora.synthgrid.generate import SynthGridConfig, generate
from avsr.corpora.synthgrid.render import Appearance, Nuisance, render_frames
from avsr.corpora.synthgrid.utterance import render_video
from avsr.corpora.synthgrid.visemes import trajectory, viseme_of
from avsr.corpora.synthgrid.voices import LEGACY_VOICES, UNSEEN_VOICES, VOICES, installed_voices
from avsr.data.media import read_video, read_wav, video_fps

NO_FESTIVAL = "festival or one of its voices is not installed (bash scripts/install.sh)"
FESTIVAL_READY = festival_available() and set(installed_voices()) == set(VOICES)
skip_without_festival = pytest.mark.skipif(not FESTIVAL_READY, reason=NO_FESTIVAL)

# --- grammar --------------------------------------------------------------------------------------


def test_grammar_slots_follow_grid():
    assert [len(slot) for slot in grammar.SLOTS] == [4, 4, 4, 25, 10, 4]
    assert "W" not in grammar.LETTERS and len(grammar.VOCABULARY) == 51
    assert all(word == word.upper() for word in grammar.VOCABULARY)


def test_sample_sentence_is_deterministic_and_grammatical():
    a = [grammar.sample_sentence(np.random.default_rng([3, i])) for i in range(50)]
    b = [grammar.sample_sentence(np.random.default_rng([3, i])) for i in range(50)]
    assert a == b and len(set(a)) > 40
    for words in a:
        grammar.check_sentence(words)


def test_transcript_code_and_festival_text():
    words = ("BIN", "BLUE", "AT", "A", "TWO", "NOW")
    assert grammar.transcript(words) == "BIN BLUE AT A TWO NOW"
    assert grammar.sentence_code(words) == "bbaa2n"
    assert grammar.festival_text(words) == "bin blue at A two now"  # the capital makes festival say /ey/


def test_check_sentence_names_the_bad_word():
    with pytest.raises(ValueError, match="'W' at position 4"):
        grammar.check_sentence(("BIN", "BLUE", "AT", "W", "TWO", "NOW"))
    with pytest.raises(ValueError, match="6 words"):
        grammar.transcript(("BIN", "BLUE"))


# --- visemes and rendering ------------------------------------------------------------------------

# a pause, consonant X, /aa/, X, /aa/, a pause
SEGMENTS = [
    (0.0, 0.2, "pau"), (0.2, 0.3, "X"), (0.3, 0.6, "aa"), (0.6, 0.7, "X"), (0.7, 1.0, "aa"), (1.0, 1.2, "pau")
]  # fmt: skip


def _segments(consonant: str) -> list[tuple[float, float, str]]:
    return [(s, e, consonant if p == "X" else p) for s, e, p in SEGMENTS]


def test_bilabials_share_a_viseme_and_render_identically():
    assert viseme_of("p") == viseme_of("b") == viseme_of("m")
    appearance = Appearance.sample(np.random.default_rng(1))
    videos = []
    for consonant in ("p", "b", "m"):
        params = trajectory(_segments(consonant), 30)
        nuisance = Nuisance.sample(np.random.default_rng(2))
        videos.append(render_frames(params, appearance, nuisance, np.random.default_rng(3)))
    assert np.array_equal(videos[0], videos[1]) and np.array_equal(videos[0], videos[2])
    other = render_frames(trajectory(_segments("s"), 30), appearance, nuisance, np.random.default_rng(3))
    assert not np.array_equal(videos[0], other)


def test_trajectory_closes_for_bilabials_and_opens_for_open_vowels():
    params = trajectory(_segments("b"), 30)  # frame i at (i + 0.5) / 25 s
    opening = params[:, 0]
    assert opening[6] < 0.1  # 0.26 s, inside the first /b/
    assert opening[11] > 0.8  # 0.46 s, middle of /aa/
    assert opening[0] < 0.1  # leading pause: lips at rest


def _mouth_darkness(frames: np.ndarray) -> np.ndarray:
    """Fraction of dark pixels (open mouth cavity) in the central box of each frame."""
    box = frames[:, 30:80, 20:76].astype(np.float32)
    return (box < 0.45 * np.median(frames, axis=(1, 2))[:, None, None]).mean(axis=(1, 2))


def test_rendered_mouth_is_darker_inside_when_open_for_many_speakers():
    rng = np.random.default_rng(0)
    config = SynthGridConfig(train_speakers=8)
    for speaker in [s for s in config.speakers() if s.split == "train"]:
        video = render_video(_segments("m"), 30, speaker, rng)
        dark = _mouth_darkness(video)
        assert dark[[11, 19]].min() > 3 * dark[[6, 16]].max() + 0.01, speaker.id


def test_render_frames_checks_its_input():
    with pytest.raises(ValueError, match=r"\(T, 6\)"):
        render_frames(np.zeros((3, 5)), Appearance(), Nuisance())
    with pytest.raises(ValueError, match="unknown|no viseme"):
        trajectory([(0.0, 0.1, "qq")], 3)


# --- festival -------------------------------------------------------------------------------------

LETTER_PHONES = {
    "A": "ey", "B": "b iy", "C": "s iy", "D": "d iy", "E": "iy", "F": "eh f", "G": "jh iy", "H": "ey ch",
    "I": "ay", "J": "jh ey", "K": "k ey", "L": "eh l", "M": "eh m", "N": "eh n", "O": "ow", "P": "p iy",
    "Q": "k y uw", "R": "aa r", "S": "eh s", "T": "t iy", "U": "y uw", "V": "v iy", "X": "eh k s",
    "Y": "w ay", "Z": "z iy",
}  # fmt: skip


@pytest.mark.festival
@skip_without_festival
@pytest.mark.parametrize("voice", sorted(VOICES))
def test_festival_says_letters_as_letter_names(voice):
    requests = [
        SynthRequest(f"u{letter}", grammar.festival_text(("BIN", "BLUE", "AT", letter, "TWO", "NOW")), voice)
        for letter in grammar.LETTERS
    ]
    for letter, result in zip(grammar.LETTERS, synthesize(requests)):
        phones = [p for _, _, p in result.segments]
        # pau b ih n b l uw ae t <letter> t uw n aw pau
        assert " ".join(phones[9:-5]) == LETTER_PHONES[letter], (letter, phones)
        assert result.wav.dtype == np.float32 and abs(len(result.wav) / 16000 - result.segments[-1][1]) < 0.1


@pytest.mark.festival
@skip_without_festival
def test_festival_failure_names_the_utterance_and_stderr(monkeypatch):
    from avsr.corpora.synthgrid import festival

    monkeypatch.setitem(festival.VOICES, "no_such_voice",
                        dataclasses.replace(festival.VOICES["kal_diphone"], name="no_such_voice"))
    good = SynthRequest("utt_good", "bin blue at F two now", "kal_diphone")
    bad = SynthRequest("utt_bad", "bin blue at F two now", "no_such_voice")
    with pytest.raises(FestivalError, match=r"(?s)utt_bad.*unbound variable"):
        synthesize([good, bad])


def test_missing_festival_executable_is_a_clear_error():
    with pytest.raises(FestivalError, match="not found on PATH"):
        synthesize([SynthRequest("u", "bin", "kal_diphone")], executable="no-such-festival-binary")


# --- corpus generation ----------------------------------------------------------------------------

TINY = SynthGridConfig(
    num_train=6, num_valid=2, num_test=3, num_test_unseen_voice=2, train_speakers=3, valid_speakers=1,
    test_speakers=2, test_unseen_voice_speakers=2, babble_speakers=2, babble_seconds=2.0,
    train_corpus="voices",
)  # fmt: skip
SPLIT_NAMES = ("train", "valid", "test", "test_unseen_voice")


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    if not FESTIVAL_READY:
        pytest.skip(NO_FESTIVAL)
    root = tmp_path_factory.mktemp("synthgrid")
    counts = generate(root, TINY, nj=1, batch_size=4, progress=False)
    return root, counts


def _utterances(root):
    return sorted(root.glob("*/*/*.txt"))


@pytest.mark.festival
def test_tiny_corpus_layout(tiny_corpus):
    root, counts = tiny_corpus
    assert counts["generated"] == 13 and counts["skipped"] == 0
    assert (root / ".done").is_file() and (root / "speakers.json").is_file()
    texts = _utterances(root)
    assert [t.parent.parent.name for t in texts].count("train") == 6 and len(texts) == 13
    assert [t.parent.parent.name for t in texts].count("test_unseen_voice") == 2
    for txt in texts:
        utt, spk, split = txt.stem, txt.parent.name, txt.parent.parent.name
        assert split in SPLIT_NAMES and utt.startswith(spk + "_")
        words = txt.read_text().strip().split()
        grammar.check_sentence(words)
        assert utt.split("_")[1] == grammar.sentence_code(words)
        video = read_video(txt.with_suffix(".mp4"))
        wav = read_wav(txt.with_suffix(".wav"))
        assert video.shape[1:] == (96, 96) and video_fps(txt.with_suffix(".mp4")) == 25.0
        assert wav.shape[0] == video.shape[0] * 640
        assert 0.01 < float(wav.abs().max()) <= 1.0
        phn = [line.split() for line in txt.with_suffix(".phn").read_text().splitlines()]
        assert float(phn[0][0]) == 0.0 and float(phn[-1][1]) == pytest.approx(video.shape[0] / 25, abs=1e-3)
    for name in ("babble_train", "babble_test"):
        assert read_wav(root / "noise" / f"{name}.wav").shape == (32000,)


@pytest.mark.festival
def test_tiny_corpus_speakers_are_disjoint(tiny_corpus):
    root, _ = tiny_corpus
    speakers = json.loads((root / "speakers.json").read_text())
    on_disk = {split: {p.name for p in (root / split).iterdir()} for split in SPLIT_NAMES}
    for a in SPLIT_NAMES:
        for b in SPLIT_NAMES:
            assert a == b or on_disk[a].isdisjoint(on_disk[b])
    for split, ids in on_disk.items():
        assert all(speakers[i]["split"] == split for i in ids)
    babble = {i for i, s in speakers.items() if s["split"].startswith("babble")}
    assert len(babble) == 4 and babble.isdisjoint(set().union(*on_disk.values()))
    assert {speakers[i]["split"] for i in babble} == {"babble_train", "babble_test"}


@pytest.mark.festival
def test_video_is_informative_open_vowels_vs_bilabials(tiny_corpus):
    root, _ = tiny_corpus
    open_dark, closed_dark = [], []
    for txt in _utterances(root):
        video = read_video(txt.with_suffix(".mp4")).numpy()
        dark = _mouth_darkness(video)
        for line in txt.with_suffix(".phn").read_text().splitlines():
            start, end, phone = float(line.split()[0]), float(line.split()[1]), line.split()[2]
            frames = [i for i in range(video.shape[0]) if start <= (i + 0.5) / 25 < end]
            if phone in ("aa", "ae", "ay", "aw"):
                open_dark += [dark[i] for i in frames]
            elif phone in ("p", "b", "m"):
                closed_dark += [dark[i] for i in frames]
    assert len(open_dark) > 5 and len(closed_dark) > 3
    assert np.mean(open_dark) > 2 * np.mean(closed_dark) + 0.01


@pytest.mark.festival
def test_generation_resumes_and_is_deterministic(tiny_corpus, tmp_path):
    root, _ = tiny_corpus
    again = generate(root, TINY, nj=1, progress=False)
    assert again == {"generated": 0, "skipped": 13, "babble_utterances": 0}
    victim = _utterances(root)[0].with_suffix(".mp4")
    before = victim.read_bytes()
    victim.unlink()
    assert generate(root, TINY, nj=1, progress=False)["generated"] == 1
    assert victim.read_bytes() == before  # regenerated identically
    # another number of workers gives the same corpus
    other = tmp_path / "other"
    smaller = dataclasses.replace(TINY, num_train=3, num_valid=2, num_test=0, num_test_unseen_voice=0,
                                  babble_seconds=0.0)
    generate(other, smaller, nj=2, batch_size=1, progress=False)
    assert len(_utterances(other)) == 5
    for txt in _utterances(other):  # augmented train and valid utterances included
        twin = root / txt.relative_to(other)
        assert txt.read_text() == twin.read_text()
        assert txt.with_suffix(".wav").read_bytes() == twin.with_suffix(".wav").read_bytes()
        assert txt.with_suffix(".mp4").read_bytes() == twin.with_suffix(".mp4").read_bytes()


@pytest.mark.festival
def test_generation_refuses_another_config_in_the_same_directory(tiny_corpus):
    root, _ = tiny_corpus
    with pytest.raises(ValueError, match="another configuration.*seed"):
        generate(root, dataclasses.replace(TINY, seed=1), progress=False)


@pytest.mark.festival
def test_voices_per_split_and_the_test_split_kept(tiny_corpus, tmp_path):
    """Unseen voices speak only test_unseen_voice; test speaks the legacy English voices, clean, and its
    files do not depend on the training voices or the augmentation."""
    root, _ = tiny_corpus
    speakers = json.loads((root / "speakers.json").read_text())
    for info in speakers.values():
        if info["split"] in ("train", "valid", "babble_train"):
            assert info["voice"] not in UNSEEN_VOICES
        elif info["split"] == "test_unseen_voice":
            assert info["voice"] in UNSEEN_VOICES and not info["channel"]["eq"]
        else:
            assert info["voice"] in LEGACY_VOICES and info["alpha"] is None and not info["channel"]["eq"]
    plain = dataclasses.replace(TINY, num_train=1, num_valid=0, num_test_unseen_voice=0, babble_seconds=0.0,
                                train_voices=LEGACY_VOICES, augment=None, speed_factors=(1.0,))
    generate(tmp_path, plain, nj=1, progress=False)
    tests = sorted((tmp_path / "test").glob("*/*.*"))
    assert len(tests) == 3 * 4
    for f in tests:
        assert f.read_bytes() == (root / f.relative_to(tmp_path)).read_bytes(), f


@pytest.mark.festival
def test_training_audio_is_augmented_reproducibly(tiny_corpus):
    from avsr.corpora.synthgrid.generate import plan_utterances

    root, _ = tiny_corpus
    specs = {s.utt_id: s for s in plan_utterances(TINY, TINY.speakers())}
    for spec in specs.values():
        if spec.split in ("train", "valid"):
            assert spec.augment == TINY.augment and spec.speed in TINY.speed_factors
            assert spec.augmentation() == spec.augmentation()  # a function of the utterance alone
        else:
            assert spec.augment is None and spec.speed == 1.0 and spec.augmentation() == []


# --- pieces without festival --------------------------------------------------------------------------------


def test_english_training_corpus_is_the_first_corpora_s():
    """train_corpus "english" (the recipe's default): train, valid and the training babble are the three
    English voices drawn as the first corpora drew them, clean and unperturbed; only test_unseen_voice uses
    other voices."""
    from avsr.corpora.synthgrid.generate import plan_utterances
    from avsr.corpora.synthgrid.speakers import make_speakers

    config = dataclasses.replace(TINY, train_corpus="english")
    speakers = config.speakers()
    for spk in speakers:
        assert (spk.voice in UNSEEN_VOICES) == (spk.split == "test_unseen_voice")
    legacy = make_speakers({"train": 3, "valid": 1}, config.seed)  # no voices given: the first corpora's draw
    assert [s for s in speakers if s.split in ("train", "valid")] == legacy
    for spec in plan_utterances(config, speakers):
        assert spec.augment is None and spec.speed == 1.0
    assert config.voices_used() == sorted(set(LEGACY_VOICES) | set(UNSEEN_VOICES))
    with pytest.raises(ValueError, match="train_corpus"):
        dataclasses.replace(TINY, train_corpus="german").check()


def test_accented_training_utterances_are_added_to_the_english_corpus():
    """num_train_accented: more training utterances, in the accented voices, by speakers of their own, clean
    and unperturbed, in the train directory; every other utterance and speaker stays as it was."""
    from avsr.corpora.synthgrid.generate import plan_utterances

    base = dataclasses.replace(TINY, train_corpus="english")
    mixed = dataclasses.replace(base, num_train_accented=5, train_accented_speakers=2)
    mixed.check()
    assert set(mixed.accented_voices) == {v for v in mixed.train_voices if not VOICES[v].english}
    assert set(mixed.voices_used()) == set(base.voices_used()) | set(mixed.accented_voices)
    speakers = mixed.speakers()
    accented = [s for s in speakers if s.split == "train_accented"]
    assert [s.id for s in accented] == ["ta000", "ta001"]
    assert all(s.voice in mixed.accented_voices and not s.channel.eq for s in accented)
    assert [s for s in speakers if s.split != "train_accented"] == base.speakers()
    before = plan_utterances(base, base.speakers())
    after = plan_utterances(mixed, speakers)
    assert after[: len(before)] == before
    added = after[len(before):]
    assert len(added) == 5 and {s.speaker.id for s in added} == {"ta000", "ta001"}
    assert all(s.split == "train" and s.augment is None and s.speed == 1.0 for s in added)
    assert all(s.path(Path("c"), ".wav").parts[:3] == ("c", "train", s.speaker.id) for s in added)
    assert {s.utt_id for s in added}.isdisjoint(s.utt_id for s in before)
    with pytest.raises(ValueError, match="num_train_accented"):
        dataclasses.replace(TINY, num_train_accented=2).check()  # the voices corpus has them already
    with pytest.raises(ValueError, match="non-English voice"):
        dataclasses.replace(mixed, train_voices=LEGACY_VOICES).check()
    with pytest.raises(ValueError, match="train_accented_speakers"):
        dataclasses.replace(mixed, train_accented_speakers=0).check()


def test_a_corpus_made_before_a_new_key_still_resumes(tmp_path):
    """synthgrid.json of a corpus made before num_train_accented existed: the key has its default there, so
    the same corpus resumes and a corpus with accented utterances is refused with the key named."""
    from avsr.corpora.synthgrid.generate import _check_previous_config

    base = dataclasses.replace(TINY, train_corpus="english")
    old = json.loads(json.dumps(dataclasses.asdict(base)))
    del old["num_train_accented"], old["train_accented_speakers"]
    (tmp_path / "synthgrid.json").write_text(json.dumps(old))
    _check_previous_config(tmp_path, base)
    with pytest.raises(ValueError, match="num_train_accented"):
        _check_previous_config(tmp_path, dataclasses.replace(base, num_train_accented=3))


@pytest.mark.festival
def test_accented_training_utterances_are_generated(tmp_path):
    if not FESTIVAL_READY:
        pytest.skip(NO_FESTIVAL)
    config = SynthGridConfig(num_train=1, num_valid=0, num_test=0, train_speakers=1, babble_seconds=0.0,
                             num_train_accented=2, train_accented_speakers=2)
    assert generate(tmp_path, config, nj=1, progress=False)["generated"] == 3
    speakers = json.loads((tmp_path / "speakers.json").read_text())
    texts = sorted((tmp_path / "train").glob("ta*/*.txt"))
    assert [t.parent.name for t in texts] == ["ta000", "ta001"]
    for txt in texts:
        assert speakers[txt.parent.name]["voice"] in config.accented_voices
        grammar.check_sentence(txt.read_text().split())
        video, wav = read_video(txt.with_suffix(".mp4")), read_wav(txt.with_suffix(".wav"))
        assert wav.shape[0] == video.shape[0] * 640 and 0.01 < float(wav.abs().max()) <= 1.0


def test_align_lengths_gives_640_samples_per_frame():
    from avsr.corpora.synthgrid.utterance import align_lengths

    segments = [(0.0, 0.2, "pau"), (0.2, 0.5, "aa"), (0.5, 1.013, "pau")]
    wav, aligned, frames = align_lengths(np.ones(16000, dtype=np.float32), segments)
    assert frames == 25 and wav.shape == (25 * 640,) and wav[16000:].sum() == 0  # padded to cover the phones
    assert aligned[-1][1] == pytest.approx(1.0) and len(aligned) == 3


def test_babble_sums_overlapping_talkers_at_a_fixed_level():
    from avsr.corpora.synthgrid.babble import BABBLE_DBFS, mix_babble, trim_silence

    talk = trim_silence(
        np.ones(16000, dtype=np.float32), [(0.0, 0.25, "pau"), (0.25, 0.75, "aa"), (0.75, 1.0, "pau")]
    )
    assert talk.shape == (8000,)
    babble = mix_babble([talk * (k + 1) for k in range(5)], 5 * 16000, 6, np.random.default_rng(0))
    assert babble.shape == (80000,) and babble.dtype == np.float32
    assert 20 * np.log10(np.sqrt(np.mean(babble.astype(np.float64) ** 2))) == pytest.approx(
        BABBLE_DBFS, abs=0.01
    )
    assert (np.abs(babble) > 1e-4).mean() > 0.95  # hardly any gap where no talker speaks


def test_cli_refuses_a_directory_of_another_configuration(tmp_path, capsys):
    from avsr.bin.synthgrid import main

    (tmp_path / "synthgrid.json").write_text(
        json.dumps(dataclasses.asdict(dataclasses.replace(TINY, seed=7)))
    )
    # A configuration mismatch is a usage/config error: exit status 2, one line naming the directory.
    assert main(["--out", str(tmp_path), "--num-train", "6", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "another configuration" in err[0]


@pytest.mark.festival
@skip_without_festival
def test_cli_generates_a_corpus(tmp_path):
    from avsr.bin.synthgrid import main

    argv = [
        "--out",
        str(tmp_path),
        "--num-train",
        "2",
        "--num-valid",
        "1",
        "--num-test",
        "1",
        "--train-speakers",
        "2",
    ]
    assert main([*argv, "--num-test-unseen-voice", "2", "--babble-seconds", "1", "--nj", "2",
                 "--no-progress"]) == 0
    assert (tmp_path / ".done").is_file() and len(_utterances(tmp_path)) == 6
