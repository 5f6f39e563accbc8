"""Generate the SynthGRID corpus: parallel, deterministic given the seed, resumable.

Layout (see INTERFACES.md): ``<corpus>/<split>/<spk>/<utt>.{wav,mp4,txt,phn}`` for the splits train, valid,
test and test_unseen_voice (disjoint speakers), ``<corpus>/noise/babble_train.wav`` and ``babble_test.wav``
(babble of extra speakers, different ones for train and test), ``<corpus>/speakers.json`` (speaker id ->
split, voice, prosody, vocal tract, microphone, appearance), ``<corpus>/lexicon.txt`` (the GRID words'
phones, Kaldi format: the targets of the phone CTC loss), ``<corpus>/synthgrid.json`` (the configuration)
and ``<corpus>/.done`` at the end.

Voices: with ``train_corpus="voices"`` train, valid and the training babble speak with ``train_voices``
(default: every festival voice of :mod:`avsr.corpora.synthgrid.voices` but the held-out ones, half of the
speakers native English), and their utterances pass through the acoustic augmentation
(:mod:`avsr.corpora.synthgrid.augment`) and a per-utterance speed factor; with ``train_corpus="english"`` (the
default) they are the first corpora's three English voices, drawn as then, clean. test_unseen_voice speaks
with ``unseen_voices`` (voices in no training utterance: the recipe's voice-generalisation test), test and the
test babble with the three English voices of the first corpora, drawn as then (the same files). The test
splits are clean. ``num_train_accented`` adds to the English corpus' train split utterances of the accented
voices (every non-English voice of ``train_voices``), clean, by speakers of their own (``ta000``...), leaving
every other file as it was.

Engines: ``engines`` names the synthesisers of train, valid and the training babble (default festival
alone: the corpus is then file for file the one festival-only versions made). Adding ``espeak-ng`` or
``flite`` makes those splits' speakers cycle through the engines in turn (festival's voices of the chosen
training corpus, then each other engine's training voices,
:func:`avsr.corpora.synthgrid.engines.engine_voices`);
leaving an engine out of ``engines`` holds it out of training (leave-one-engine-out). ``test_espeak_ng`` and
``test_flite`` (``num_test_espeak_ng``, ``num_test_flite``) are spoken by each engine's held-out voices, which
no training utterance uses whatever the engines: the same test sets for every training configuration, the
engines' counterpart of test_unseen_voice.

Every random choice is seeded by ``(seed, split, index)`` of the utterance, never by the order of work, so
the corpus is the same for any number of workers. Work is cut into batches of utterances of one voice, one
festival process per batch, spread over ``nj`` processes. An utterance whose four files exist is skipped,
every file is written atomically, so an interrupted run is resumed by running the same command again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from avsr.corpora.synthgrid import engines as engines_mod
from avsr.corpora.synthgrid.augment import AugmentConfig
from avsr.corpora.synthgrid.babble import mix_babble, trim_silence
from avsr.corpora.synthgrid.engines import ENGINES, EngineError, engine_available, engine_voices
from avsr.corpora.synthgrid.festival import FestivalError, Synthesis, synthesize
from avsr.corpora.synthgrid.grammar import festival_text, sample_sentence
from avsr.corpora.synthgrid.speakers import AUGMENTED_SPLITS, Speaker, make_speakers
from avsr.corpora.synthgrid.utterance import (
    SAMPLE_RATE,
    UttSpec,
    normalise_level,
    write_utterance,
)
from avsr.corpora.synthgrid.voices import (
    LEGACY_VOICES,
    TRAIN_VOICES,
    UNSEEN_VOICES,
    VOICES,
    english_lexicon,
    installed_voices,
)
from avsr.data.media import write_wav
from avsr.fileio import write_text_atomic

logger = logging.getLogger(__name__)

#: corpus splits; the order is part of the seeding (new splits are appended)
SPLITS = ("train", "valid", "test", "test_unseen_voice", "train_accented", "test_espeak_ng", "test_flite")
#: the test split of each engine's held-out voices
ENGINE_TEST_SPLITS = {"espeak-ng": "test_espeak_ng", "flite": "test_flite"}
#: the directory of a split's utterances where it is not the split's name: the accented training utterances
#: are training utterances (``<corpus>/train/ta000/...``), so the training data dir holds them
SPLIT_DIRS = {"train_accented": "train"}
#: what the training splits are made of (:attr:`SynthGridConfig.train_corpus`)
TRAIN_CORPORA = ("english", "voices")
BABBLE_SETS = ("babble_train", "babble_test")


@dataclass(frozen=True)
class SynthGridConfig:
    """Sizes and randomness of a SynthGRID corpus (everything that changes its content).

    Attributes:
        num_train, num_valid, num_test, num_test_unseen_voice: utterances per split (>= 0).
        train_speakers, valid_speakers, test_speakers, test_unseen_voice_speakers: speakers per split
            (>= 1); utterances go round-robin.
        babble_speakers: speakers of each babble set (train babble and test babble have their own).
        babble_seconds: length of each babble file in seconds (0: no babble files).
        babble_overlap: number of simultaneous talkers in the babble.
        seed: random seed.
        nuisance: strength of the per-utterance video nuisance (head motion, lighting, noise; 0 = none).
        target_jitter: token-to-token variation of the viseme targets (articulatory units).
        train_voices: voices of train, valid and the training babble.
        unseen_voices: voices of test_unseen_voice (must not be training voices).
        speed_factors: per-utterance speed perturbation of train and valid, drawn uniformly.
        augment: the acoustic augmentation of train and valid (None: clean).
        num_train_accented: utterances added to the train split of the ``english`` corpus, spoken by the
            accented voices (:attr:`accented_voices`) with the speaker ranges of the ``voices`` corpus, clean
            and unperturbed (no acoustic augmentation, no speed perturbation); 0: none (the default corpus).
            Their speakers (``train_accented_speakers`` of them, ids ``ta000``...) and sentences are drawn
            from streams of their own, so every other file of the corpus stays the same.
        train_accented_speakers: speakers of the accented training utterances (>= 1).
        train_corpus: ``"english"``: train, valid and the training babble are drawn as in the first SynthGRID
            corpora (the three English voices, their prosody ranges, clean, no speed perturbation;
            ``train_voices``, ``speed_factors`` and ``augment`` unused) -- the default recipe's corpus;
            ``"voices"``: every voice of ``train_voices`` with the wider speaker ranges, speed perturbation
            and acoustic augmentation (:data:`TRAIN_CORPORA`).
        engines: the synthesisers of train, valid and the training babble (:data:`ENGINES`); festival alone
            is the corpus of festival-only versions, file for file.
        num_test_espeak_ng, num_test_flite: utterances of the engines' test splits (held-out voices).
        test_engine_speakers: speakers of each of those splits (>= 1).
    """

    num_train: int = 1500
    num_valid: int = 100
    num_test: int = 200
    num_test_unseen_voice: int = 0
    train_speakers: int = 24
    valid_speakers: int = 4
    test_speakers: int = 6
    test_unseen_voice_speakers: int = 6
    babble_speakers: int = 4
    babble_seconds: float = 60.0
    babble_overlap: int = 6
    seed: int = 0
    nuisance: float = 1.0
    target_jitter: float = 0.05
    train_voices: tuple[str, ...] = TRAIN_VOICES
    unseen_voices: tuple[str, ...] = UNSEEN_VOICES
    speed_factors: tuple[float, ...] = (0.9, 1.0, 1.1)
    augment: AugmentConfig | None = AugmentConfig()
    train_corpus: str = "english"
    num_train_accented: int = 0
    train_accented_speakers: int = 300
    engines: tuple[str, ...] = ("festival",)
    num_test_espeak_ng: int = 0
    num_test_flite: int = 0
    test_engine_speakers: int = 6

    @property
    def accented_voices(self) -> tuple[str, ...]:
        """The voices of the accented training utterances: the non-English voices of ``train_voices``."""
        return tuple(v for v in self.train_voices if not VOICES[v].english)

    def check(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if self.train_corpus not in TRAIN_CORPORA:
            raise ValueError(f"SynthGRID config: train_corpus must be one of {list(TRAIN_CORPORA)}, got "
                             f"{self.train_corpus!r}")
        if not self.engines or any(e not in ENGINES for e in self.engines) or len(set(self.engines)) != len(
            self.engines
        ):
            raise ValueError(f"SynthGRID config: engines must be distinct engines of {list(ENGINES)}, got "
                             f"{list(self.engines)}")
        for name in ("num_train", "num_valid", "num_test", "num_test_unseen_voice", "num_train_accented",
                     "num_test_espeak_ng", "num_test_flite"):
            if getattr(self, name) < 0:
                raise ValueError(f"SynthGRID config: {name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "train_speakers",
            "valid_speakers",
            "test_speakers",
            "test_unseen_voice_speakers",
            "babble_speakers",
            "babble_overlap",
            "train_accented_speakers",
            "test_engine_speakers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"SynthGRID config: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("babble_seconds", "nuisance", "target_jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"SynthGRID config: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("train_voices", "unseen_voices"):
            unknown = [v for v in getattr(self, name) if v not in VOICES]
            if unknown or not getattr(self, name):
                raise ValueError(f"SynthGRID config: {name} must be voices of {sorted(VOICES)}, got "
                                 f"{list(getattr(self, name))}")
        both = set(self.train_voices) & set(self.unseen_voices)
        if both:
            raise ValueError(f"SynthGRID config: voices {sorted(both)} are both training and unseen voices")
        if self.num_train_accented > 0 and self.train_corpus != "english":
            raise ValueError("SynthGRID config: num_train_accented adds accented voices to the english "
                             f"training corpus; the {self.train_corpus!r} corpus has them in train already")
        if self.num_train_accented > 0 and not self.accented_voices:
            raise ValueError("SynthGRID config: num_train_accented needs a non-English voice in "
                             f"train_voices, got {list(self.train_voices)}")
        if not self.speed_factors or any(not 0.5 <= f <= 2.0 for f in self.speed_factors):
            raise ValueError(f"SynthGRID config: speed_factors must be in [0.5, 2], got {self.speed_factors}")
        if self.augment is not None:
            self.augment.check()

    def voices_used(self) -> list[str]:
        """The festival voices the corpus needs (sorted)."""
        festival_train = self.train_corpus == "voices" and "festival" in self.engines
        used = set(LEGACY_VOICES) | (set(self.train_voices) if festival_train else set())
        if self.num_train_accented > 0:
            used |= set(self.accented_voices)
        if self.num_test_unseen_voice > 0:
            used |= set(self.unseen_voices)
        return sorted(used)

    def engines_used(self) -> list[str]:
        """The engines the corpus needs besides festival (which the test splits always need)."""
        used = {e for e in self.engines if e != "festival"}
        used |= {e for e, split in ENGINE_TEST_SPLITS.items() if getattr(self, f"num_{split}") > 0}
        return [e for e in ENGINES if e in used]

    def training_voices(self, festival_pool: tuple[str, ...]) -> tuple[str, ...]:
        """The voice cycle of the training speakers with several engines: entry i is voice ``i // E`` of
        engine ``i mod E`` (each engine's pool repeated to the longest), so that neighbouring speakers
        alternate engines. ``festival_pool``: festival's voices of the training corpus."""
        pools = [festival_pool if e == "festival" else engine_voices(e) for e in self.engines]
        longest = max(map(len, pools))
        return tuple(pools[i % len(pools)][(i // len(pools)) % len(pools[i % len(pools)])]
                     for i in range(longest * len(pools)))

    def speakers(self) -> list[Speaker]:
        """All speakers (corpus splits and babble sets)."""
        counts = {
            "train": self.train_speakers,
            "valid": self.valid_speakers,
            "test": self.test_speakers,
            "babble_train": self.babble_speakers,
            "babble_test": self.babble_speakers,
            "test_unseen_voice": self.test_unseen_voice_speakers,
        }
        voices = {"test_unseen_voice": self.unseen_voices}
        if self.num_train_accented > 0:
            counts["train_accented"] = self.train_accented_speakers
            voices["train_accented"] = self.accented_voices
        if self.train_corpus == "voices":
            voices.update(train=self.train_voices, valid=self.train_voices, babble_train=self.train_voices)
        if self.engines != ("festival",):
            english = tuple(sorted(LEGACY_VOICES))
            pool = self.training_voices(self.train_voices if self.train_corpus == "voices" else english)
            voices.update(train=pool, valid=pool, babble_train=pool)
        for engine, split in ENGINE_TEST_SPLITS.items():
            if getattr(self, f"num_{split}") > 0:
                counts[split] = self.test_engine_speakers
                voices[split] = engine_voices(engine, unseen=True)
        return make_speakers(counts, self.seed, voices, self.augment)


def plan_utterances(config: SynthGridConfig, speakers: list[Speaker]) -> list[UttSpec]:
    """The utterances of the corpus splits: utterance j of a split goes to speaker ``j mod S``.

    The accented training utterances (split ``train_accented``) are written into the train directory
    (:data:`SPLIT_DIRS`).

    Returns:
        specs in split order, then index; sentence and rendering randomness seeded by (seed, split, j).
    """
    specs = []
    for split_index, split in enumerate(SPLITS):
        members = [s for s in speakers if s.split == split]
        augmented = split in AUGMENTED_SPLITS and config.train_corpus == "voices"
        for j in range(getattr(config, f"num_{split}")):
            words = sample_sentence(np.random.default_rng([config.seed, split_index, j]))
            speaker = members[j % len(members)]
            speed = 1.0
            if augmented:
                rng = np.random.default_rng([config.seed, split_index, j, 2])
                speed = float(config.speed_factors[int(rng.integers(len(config.speed_factors)))])
            specs.append(
                UttSpec.make(SPLIT_DIRS.get(split, split), speaker, j // len(members), words,
                             (config.seed, split_index, j, 1), speed, config.augment if augmented else None,
                             config.seed)
            )
    return specs


def plan_babble(config: SynthGridConfig, speakers: list[Speaker]) -> dict[str, list[UttSpec]]:
    """The utterances to synthesise for each babble set (about ``seconds * overlap / 1.5 s`` of them)."""
    if config.babble_seconds <= 0:
        return {}
    count = max(1, math.ceil(config.babble_seconds * config.babble_overlap / 1.5))
    plans = {}
    for set_index, name in enumerate(BABBLE_SETS):
        members = [s for s in speakers if s.split == name]
        plans[name] = [
            UttSpec.make(
                name,
                members[j % len(members)],
                j // len(members),
                sample_sentence(np.random.default_rng([config.seed, 100 + set_index, j])),
                (config.seed, 100 + set_index, j, 1),
            )
            for j in range(count)
        ]
    return plans


def _batches(specs: list[UttSpec], batch_size: int) -> list[list[UttSpec]]:
    """Cut specs into batches of at most ``batch_size`` utterances of one voice (one festival run each)."""
    ordered = sorted(specs, key=lambda s: (s.speaker.engine != "festival", s.speaker.engine, s.speaker.voice,
                                           s.speaker.id, s.utt_id))
    batches: list[list[UttSpec]] = []
    for spec in ordered:
        if (
            not batches
            or len(batches[-1]) >= batch_size
            or batches[-1][0].speaker.voice != spec.speaker.voice
            or batches[-1][0].speaker.engine != spec.speaker.engine
        ):
            batches.append([])
        batches[-1].append(spec)
    return batches


def _synthesize(specs: list[UttSpec], speed: bool = True) -> list[Synthesis]:
    """Synthesise a batch of one engine (``speed``: with the utterances' speed perturbation)."""
    if specs[0].speaker.engine != "festival":
        return engines_mod.synthesize(
            [s.speaker.engine_request(s.utt_id, s.words, s.speed if speed else 1.0) for s in specs]
        )
    if speed:
        return synthesize([s.speaker.request(s.utt_id, festival_text(s.words), s.speed) for s in specs])
    return synthesize([s.speaker.request(s.utt_id, festival_text(s.words)) for s in specs])


def _corpus_job(job: tuple[list[UttSpec], str, float, float]) -> tuple[str, int, list]:
    """Worker: synthesise and write one batch of corpus utterances."""
    specs, root, nuisance, jitter = job
    results = _synthesize(specs)
    for spec, result in zip(specs, results):
        write_utterance(spec, result, Path(root), nuisance, jitter)
    return "corpus", len(specs), []


def _babble_job(job: tuple[list[UttSpec], str]) -> tuple[str, int, list]:
    """Worker: synthesise one batch of babble utterances, return them level-normalised and trimmed."""
    specs, name = job
    results = _synthesize(specs, speed=False)
    wavs = [
        (spec.utt_id, trim_silence(normalise_level(r.wav, spec.speaker.level_db, r.segments), r.segments))
        for spec, r in zip(specs, results)
    ]
    return name, len(specs), wavs


#: rough CPU cost of synthesis per utterance in ms, by festival engine or other synthesiser
_SYNTH_MS = {"hts": 45.0, "diphone": 8.0, "clunits": 60.0, "espeak-ng": 20.0, "flite": 80.0}


def _job_cost(job: tuple) -> float:
    """Rough CPU cost of a job in ms (synthesis by engine, video ~40 ms, augmentation ~20 ms)."""
    kind, payload = job
    specs = payload[0]
    speaker = specs[0].speaker
    engine = VOICES[speaker.voice].engine if speaker.engine == "festival" else speaker.engine
    per_utt = _SYNTH_MS[engine] + (60.0 if kind == "corpus" else 0.0)
    return 200.0 + per_utt * len(specs)


def _run_job(job: tuple) -> tuple[str, int, list]:
    kind, payload = job
    return _corpus_job(payload) if kind == "corpus" else _babble_job(payload)


def _config_json(config: SynthGridConfig) -> dict:
    """``config`` as ``synthgrid.json`` holds it (tuples as JSON lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _check_previous_config(root: Path, config: SynthGridConfig) -> None:
    """Refuse to resume into a directory generated with another configuration."""
    path = root / "synthgrid.json"
    wanted = _config_json(config)
    if path.is_file():
        # a key added since the corpus was made has its default there (the files of a default never change)
        found = {**_config_json(SynthGridConfig()), **json.loads(path.read_text())}
        if found != wanted:
            diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
            raise ValueError(
                f"{root} holds a SynthGRID corpus generated with another configuration (key: (found, wanted) "
                f"{diff}); use another --out directory or delete {root}"
            )
    else:
        write_text_atomic(path, json.dumps(wanted, indent=2) + "\n")


def _check_setup(config: SynthGridConfig, nj: int, batch_size: int) -> None:
    """Refuse a bad configuration or job setting, and voices or engines that are not installed.

    Raises:
        ValueError, FestivalError, EngineError: as :func:`generate`.
    """
    config.check()
    if nj < 1 or batch_size < 1:
        raise ValueError(f"nj and batch_size must be >= 1, got {nj} and {batch_size}")
    missing = [v for v in config.voices_used() if v not in installed_voices()]
    if missing:
        packages = " ".join(VOICES[v].package for v in missing)
        raise FestivalError(f"festival voice(s) {missing} not installed (Debian packages {packages}; "
                            "bash scripts/install.sh installs them)")
    absent = [e for e in config.engines_used() if not engine_available(e)]
    if absent:
        raise EngineError(f"speech synthesiser(s) {absent} not installed (Debian packages "
                          f"{' '.join(absent)}; bash scripts/install.sh installs them)")


def _run_jobs(jobs: list, babble_sets: list[str], total: int, nj: int, progress: bool) -> dict[str, list]:
    """Run the corpus and babble jobs (in this process, or ``nj`` worker processes, longest first) with a
    progress bar over ``total`` utterances; returns each babble set's ``(index, waveform)`` pairs."""
    babble_wavs: dict[str, list] = {name: [] for name in babble_sets}
    with tqdm(total=total, desc="SynthGRID", unit="utt", disable=not progress) as bar:
        if nj == 1:
            results = map(_run_job, jobs)
            pool = None
        else:
            pool = multiprocessing.get_context().Pool(nj)
            results = pool.imap_unordered(_run_job, jobs)
        try:
            for kind, count, wavs in results:
                if kind != "corpus":
                    babble_wavs[kind] += wavs
                bar.update(count)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    return babble_wavs


def generate(
    root: str | Path, config: SynthGridConfig, nj: int = 1, batch_size: int = 50, progress: bool = True
) -> dict[str, int]:
    """Generate (or complete) a SynthGRID corpus under ``root``.

    Args:
        root: corpus directory (created if missing).
        config: sizes and randomness; must match the one of an existing corpus in ``root``.
        nj: worker processes (1: run in this process).
        batch_size: utterances per festival process.
        progress: show a tqdm progress bar.

    Returns:
        counts: ``{"generated": n, "skipped": n, "babble_utterances": n}``.

    Raises:
        ValueError: invalid config, or ``root`` holds a corpus of another configuration.
        avsr.corpora.synthgrid.festival.FestivalError: festival missing or failing (names the utterance).
        avsr.corpora.synthgrid.engines.EngineError: eSpeak NG or flite missing or failing.
        avsr.data.media.MediaError: a file cannot be written.
    """
    _check_setup(config, nj, batch_size)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _check_previous_config(root, config)
    speakers = config.speakers()
    write_text_atomic(
        root / "speakers.json", json.dumps({s.id: s.to_dict() for s in speakers}, indent=1) + "\n"
    )
    english_lexicon().write(root / "lexicon.txt")
    (root / ".done").unlink(missing_ok=True)

    specs = plan_utterances(config, speakers)
    pending = [s for s in specs if not s.is_complete(root)]
    babble = {
        name: plan
        for name, plan in plan_babble(config, speakers).items()
        if not (root / "noise" / f"{name}.wav").is_file()
    }
    logger.info(
        "SynthGRID in %s: %d utterances (%d to generate, %d already there), %d babble utterances, %d workers",
        root,
        len(specs),
        len(pending),
        len(specs) - len(pending),
        sum(map(len, babble.values())),
        nj,
    )
    jobs = [
        ("corpus", (batch, str(root), config.nuisance, config.target_jitter))
        for batch in _batches(pending, batch_size)
    ]
    for name, plan in babble.items():
        jobs += [("babble", (batch, name)) for batch in _batches(plan, batch_size)]
    jobs.sort(key=_job_cost, reverse=True)  # longest first: the workers finish together

    start = time.time()
    total = len(pending) + sum(map(len, babble.values()))
    babble_wavs = _run_jobs(jobs, list(babble), total, nj, progress)
    for name, wavs in babble_wavs.items():
        wavs = [w for _, w in sorted(wavs, key=lambda item: item[0])]
        rng = np.random.default_rng([config.seed, 200 + BABBLE_SETS.index(name)])
        mix = mix_babble(wavs, int(config.babble_seconds * SAMPLE_RATE), config.babble_overlap, rng)
        (root / "noise").mkdir(exist_ok=True)
        write_wav(root / "noise" / f"{name}.wav", mix, SAMPLE_RATE)
    write_text_atomic(
        root / ".done", json.dumps({"utterances": len(specs), "seconds": time.time() - start}) + "\n"
    )
    logger.info(
        "SynthGRID done in %.1f s: %d generated, %d skipped",
        time.time() - start,
        len(pending),
        len(specs) - len(pending),
    )
    return {
        "generated": len(pending),
        "skipped": len(specs) - len(pending),
        "babble_utterances": sum(map(len, babble.values())),
    }
