"""The recipe's decoding stage (:func:`decode_test_set`, ``avsr.bin.decode``): a test set under every
modality and noise condition, into a decode directory.

For each modality (``audio``, ``video``, ``audiovisual``) and condition (``clean``, then ``<noise>_<snr>`` for
each SNR when a noise file is given) the stage writes ``<out>/<test_set>/<modality>/<condition>/hyp`` and
``ref`` (Kaldi text: ``<utt-id> WORDS``), each atomically, and ``failed`` (``<utt-id> <reason>``) when some
utterances could not be decoded (they are reported and skipped, the others decoded), and ``audio_only``
(``<utt-id> <reason>``) when some audio-visual utterances were decoded from their audio alone because their
video could not be used (unreadable, no face, too few frames; their hypotheses are in ``hyp``, and the log
says how many). A condition whose ``hyp`` exists is skipped, so an interrupted decoding resumes -- when the
settings match: each modality directory records them in ``decode_settings.yaml`` (:func:`decode_settings`:
model, checkpoints chosen with their sizes and times, tokenizer, decoding configuration, data dir, precision;
each noisy condition its noise file), and a directory holding results made with other settings is refused
with the differing keys named (:class:`SettingsConflict`), or cleared and decoded anew with ``overwrite``
(:func:`claim`; ``--overwrite``).
All decoding goes through :class:`avsr.inference.Transcriber` (the same path as ``avsr transcribe`` and Python
users): the noise segment and the SNR of an utterance are a function of its id, so every run decodes the same
noisy audio. Each utterance gets the silent edges of the model's training audio where its audio, as mixed for
the condition, shows them (``edge_frames``, ``--edge-frames``; recorded in ``decode_settings.yaml`` when
inputs are changed). Without that change, video-only input does not depend on the audio noise: it is decoded
once and its hypotheses are written for every condition; with it, video-only input is decoded in every
condition (a noisy recording hides the edges). Audio-visual and video-only decoding run the video front-end
once per utterance and change of its edges and reuse its output in the other noise conditions (the
Transcriber's ``video_cache``). Audio-visual hypotheses are ranked with the model's single-stream views too
where the decoding configuration's ``video_weight`` or ``audio_weight`` (or, when null, the model's default)
is above 0; the audio-visual directory's ``decode_settings.yaml`` then records them (``view_weights``, with
``audio_confidence``), and the other modalities' do not. The views the ranking searches are each the same
search as decoding that stream alone, so the audio-visual pass, which runs first, also gives the video-only
results (with a video weight) and the audio-only results (with the confidence check) of the conditions it
decodes (:func:`views_searched`, :attr:`avsr.inference.Transcript.views`); only an utterance the audio-visual
pass could not decode, or a condition whose audio-visual results exist already, is decoded alone.

Before anything is decoded, every media file the chosen modalities read (``wav.scp`` for audio and
audio-visual decoding and, with the training edges, for video-only decoding too; ``video.scp`` for video and
audio-visual decoding) must exist: a data dir with a missing file or entry is refused in one line naming the
utterance and the file (exit status 1), rather than scored with the utterance as a failure. Utterances whose
files exist but cannot be decoded (unreadable media, too short) are listed in ``failed`` and scored as all
errors (``avsr.bin.score`` says how many).

The model is the element-wise average of the ``--average-nbest`` epoch checkpoints with the best validation
accuracy (ESPnet's ``valid.acc.ave``), or ``--checkpoint``: an avsr checkpoint or an official fine-tuned
AV-HuBERT one (fairseq ``av_hubert_seq2seq``/``av_hubert_ctc``, read by :mod:`avsr.compat`) with its
sentencepiece model as ``--bpemodel`` (default: the one pickled in the checkpoint). Decode such a model with
``conf/decode/avhubert_s2s.yaml`` (fairseq's beam search, as AV-HuBERT's ``infer_s2s.py``); its lower-case
hypotheses are upper-cased, as avsr's references.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from avsr.checkpoint import best_checkpoints
from avsr.config import config_path, parse_yaml, to_dict
from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_kaldi_map
from avsr.decode.config import ViewWeights, load_decode_config, searched_views
from avsr.fileio import remove_stale_tmp, write_text_atomic
from avsr.inference.pretrained import ModelDefaults, model_defaults
from avsr.inference.segments import EdgeRanges, check_edges
from avsr.inference.transcriber import Transcriber
from avsr.modalities import MODALITY_INPUTS

__all__ = ["DecodeJob", "SettingsConflict", "decode_settings", "claim", "check_media", "views_searched",
           "decode_test_set"]

logger = logging.getLogger("avsr.decode")


class SettingsConflict(ValueError):
    """A decode directory holds results made with other settings (the differing keys named); decode into
    another directory, or pass ``overwrite=True``."""


@dataclass
class DecodeJob:
    """What the decoding stage decodes, and how.

    Attributes:
        source: the model: an experiment directory (its ``average_nbest`` best checkpoints averaged) or a
            checkpoint file (avsr's or an official AV-HuBERT one).
        bpemodel: the sentencepiece model, or None (see :meth:`Transcriber.from_pretrained`).
        decode_config: the decoding YAML, a path or a shipped name.
        data: the test data dir.
        out: the decode directory (results under ``<out>/<test_set>``).
        test_set: the test set's name in the results.
        modalities: the decoded modalities (keys of :data:`avsr.modalities.MODALITY_INPUTS`).
        noise_file, noise_name, snrs: the noisy conditions ``<noise_name>_<snr>`` (none without a file).
        average_nbest, batch_frames, precision, edge_frames, device: as
            :meth:`Transcriber.from_pretrained`.
        overwrite: clear results made with other settings instead of refusing them.
    """

    source: Path
    bpemodel: Path | None
    decode_config: str
    data: Path
    out: Path
    test_set: str
    modalities: Sequence[str] = tuple(MODALITY_INPUTS)
    noise_file: Path | None = None
    noise_name: str = "babble"
    snrs: Sequence[float] = field(default_factory=lambda: [10.0, 5.0, 0.0, -5.0])
    average_nbest: int = 5
    batch_frames: int = 3000
    precision: str = "fp32"
    edge_frames: EdgeRanges | Sequence[int | Sequence[int]] | str | None = "model"
    device: str | torch.device = "cpu"
    overwrite: bool = False

    def conditions(self) -> list[tuple[str, float | None]]:
        """``(name, snr_db)`` of each condition: ``("clean", None)``, then one per SNR of the noise file."""
        noisy = [(f"{self.noise_name}_{snr:g}", snr) for snr in self.snrs] if self.noise_file else []
        return [("clean", None), *noisy]

    @functools.cached_property
    def transcriber(self) -> Transcriber:
        """The :class:`Transcriber` of the job's model and settings (built on first use, then kept)."""
        return Transcriber.from_pretrained(
            self.source, bpemodel=self.bpemodel, device=self.device, decode_config=self.decode_config,
            average_nbest=self.average_nbest, precision=self.precision, batch_frames=self.batch_frames,
            edge_frames=self.edge_frames)


def _file_id(path: Path) -> str:
    stat = path.stat()
    return f"{path.name} ({stat.st_size} bytes, modified {stat.st_mtime_ns})"


def decode_settings(job: DecodeJob) -> dict[str, Any]:
    """What the hypotheses depend on (the content of ``decode_settings.yaml``): the model and its
    checkpoints (names, sizes, times), the tokenizer, the decoding configuration, the data dir, the precision;
    the edges (only when inputs are changed: earlier results stay valid), the audio-visual view weights
    (only when above 0) and the decision on the lips (``video_sync``: ``video_sync_margin`` and
    ``video_sync_slope``, and ``video_max_entropy`` where set; only where a margin is set); the last two only
    in the audio-visual directory's settings.

    Raises:
        FileNotFoundError: no checkpoint; avsr.config.ConfigError: a bad decoding configuration;
        ValueError: bad ``edge_frames``.
    """
    source, bpemodel = job.source, job.bpemodel
    if source.is_dir():
        checkpoints = [_file_id(p) for p in best_checkpoints(source, job.average_nbest)]
    elif source.is_file():
        checkpoints = [_file_id(source)]
    else:
        raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")
    config = load_decode_config(config_path(job.decode_config, "decode"))
    decode = {"search": config.search, **to_dict(config)}
    # the views' weights and the decision on the lips are recorded below only where they change the hypotheses
    for key in ("video_weight", "audio_weight", "audio_confidence", "video_sync_margin", "video_sync_slope",
                "video_max_entropy"):
        decode.pop(key, None)
    settings = {
        "model": str(source.resolve()),
        "checkpoints": checkpoints,
        "bpemodel": str(bpemodel.resolve()) if bpemodel is not None and bpemodel.is_file() else None,
        "decode_config": decode,
        "data": str(job.data.resolve()),
        "precision": job.precision,
    }
    rescored = "audiovisual" in job.modalities and config.search == "espnet"
    # read from the checkpoint only when needed, once (official ones are big)
    defaults = ModelDefaults(None, ViewWeights(), {})
    if job.edge_frames == "model" or (rescored and None in (
            config.video_weight, config.audio_weight, config.audio_confidence, config.video_sync_margin,
            config.video_sync_slope, config.video_max_entropy)):
        defaults = model_defaults(source, job.average_nbest)
    edges = defaults.edge_frames if job.edge_frames == "model" else job.edge_frames
    edges = check_edges(edges, "edge_frames") if edges is not None else None
    if edges is not None:
        settings["edge_frames"] = [list(edges[0]), list(edges[1])]
    if rescored:  # audio-visual results only (see decode_test_set)
        weights = config.view_weights(defaults.view_weights)
        if weights.video_weight > 0 or weights.audio_weight > 0:
            settings["view_weights"] = weights._replace(
                audio_confidence=weights.audio_confidence if weights.audio_weight > 0 else 0.0)._asdict()
    rule = config.sync_rule(defaults.decode_defaults) if "audiovisual" in job.modalities else None
    if rule is not None:
        settings["video_sync"] = {"video_sync_margin": rule[0], "video_sync_slope": rule[1]}
        entropy = config.entropy_bar(defaults.decode_defaults)
        if entropy is not None:
            settings["video_sync"]["video_max_entropy"] = entropy
    return settings


def claim(out: Path, settings: dict[str, Any], overwrite: bool, results: list[Path]) -> None:
    """Record ``settings`` in ``out/decode_settings.yaml``; ``results`` (``hyp`` files below ``out``) made
    with other settings are refused or, with ``overwrite``, removed with their condition directories.

    Raises:
        SettingsConflict: ``out`` holds results of other settings (the differing keys named) and no
            ``overwrite``.
    """
    path = out / "decode_settings.yaml"
    if path.is_file() and results:
        old = parse_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
        differ = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if differ and not overwrite:
            raise SettingsConflict(f"{out} holds results decoded with other settings ({', '.join(differ)} "
                                   f"differ; see {path})")
        if differ:
            logger.warning("%s: settings changed (%s): decoding anew", out, ", ".join(differ))
            for hyp in results:
                shutil.rmtree(hyp.parent)
    elif results and overwrite:
        for hyp in results:
            shutil.rmtree(hyp.parent)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(settings, sort_keys=True))


def check_media(utts: list[Utterance], data: Path, modalities: Sequence[str], edges: bool) -> None:
    """Refuse a data dir whose media files for ``modalities`` are not all there.

    Args:
        utts: the utterances of the data dir ``data``.
        data: the data dir (named in the message).
        modalities: the decoded modalities (keys of :data:`avsr.modalities.MODALITY_INPUTS`).
        edges: whether inputs get the training edges (video-only decoding then reads the audio too).

    Raises:
        DataDirError: an utterance has no entry for a needed stream, or its file does not exist (the first
            such utterance, its ``wav.scp``/``video.scp`` file and path named, and how many in all).
    """
    streams = {s for m in modalities for s in MODALITY_INPUTS[m]}
    if edges and "video" in modalities:
        streams.add("audio")
    scp = {"audio": "wav.scp", "video": "video.scp"}
    problems = []
    for u in utts:
        for stream in ("audio", "video"):
            if stream not in streams:
                continue
            path = u.wav if stream == "audio" else u.video
            if path is None:
                problems.append(f"{data / scp[stream]}: utterance '{u.utt_id}' has no entry, but the "
                                f"{stream} stream is decoded ({', '.join(modalities)})")
            elif not Path(path).is_file():
                problems.append(f"{data / scp[stream]}: utterance '{u.utt_id}': {path}: no such file")
    if problems:
        more = f" ({len(problems)} missing in all)" if len(problems) > 1 else ""
        raise DataDirError(f"{problems[0]}{more}; nothing was decoded")


def decode_test_set(job: DecodeJob) -> Path:
    """Decode ``job`` into ``<out>/<test_set>`` (see the module docstring); returns that directory.

    The settings and the data dir's media are checked before anything is decoded; the model is loaded only
    when a condition is left to decode.

    Raises:
        FileNotFoundError, avsr.config.ConfigError: as :func:`decode_settings`; DataDirError: as
            :func:`check_media` and :func:`avsr.data.datadir.read_datadir`; SettingsConflict: as
            :func:`claim`.
    """
    settings = decode_settings(job)  # checks the model and the decoding config first
    utts = read_datadir(job.data)
    check_media(utts, job.data, job.modalities, "edge_frames" in settings)
    root = job.out / job.test_set
    for path in remove_stale_tmp(root, recursive=True):
        logger.info("removed %s, left by an interrupted write", path)
    for modality in job.modalities:  # each modality directory records its settings
        mod_settings = {k: v for k, v in settings.items()
                        if k not in ("view_weights", "video_sync") or modality == "audiovisual"}
        out_mod = root / modality
        claim(out_mod, mod_settings, job.overwrite, sorted(out_mod.glob("*/hyp")))
    _decode_conditions(job, settings, utts)
    return root


def views_searched(settings: dict[str, Any], modalities: Sequence[str]) -> list[str]:
    """The single-stream modalities among ``modalities`` whose hypotheses audio-visual decoding yields: the
    views its ranking searches (``video`` with ``video_weight`` > 0, ``audio`` with ``audio_weight`` and
    ``audio_confidence`` > 0, from ``settings["view_weights"]``, see :func:`decode_settings` and
    :func:`avsr.decode.config.searched_views`); none without ``audiovisual`` in ``modalities``."""
    weights = settings.get("view_weights")
    if "audiovisual" not in modalities or not weights:
        return []
    return [m for m in searched_views(ViewWeights(**weights)) if m in modalities]


def _decode_conditions(job: DecodeJob, settings: dict[str, Any], utts: list[Utterance]) -> None:
    """Every condition of every modality into ``<out>/<test_set>/<modality>/<condition>``, skipping those
    done. Audio-visual decoding comes first and gives the modalities of :func:`views_searched` their
    hypotheses (its views' own searches: the same hypotheses as decoding them alone); an utterance it could
    not decode, or a modality whose audio-visual results already exist, is decoded on its own."""
    root = job.out / job.test_set
    refs = {u.utt_id: u.text for u in utts}
    conditions = job.conditions()
    modalities = sorted(job.modalities, key=lambda m: m != "audiovisual")  # audio-visual first
    from_views = views_searched(settings, modalities)
    # with the model's training edges (found in the audio as mixed for each condition: a noisy recording
    # hides them) video-only input depends on the noise too, and is decoded in every condition
    edges = "edge_frames" in settings
    video_input = [m for m in modalities if m == "audiovisual" or (m == "video" and edges)]
    # the video front-end's output of every utterance, kept for the other conditions (one set of videos)
    cache: dict[str, torch.Tensor] | None = {} if video_input and len(conditions) > 1 else None
    video_hyps: tuple[dict[str, str], dict[str, str]] | None = None
    for cond, snr in conditions:
        todo = []
        for modality in modalities:
            out_dir = root / modality / cond
            if snr is not None:  # the noise recording of a noisy condition
                noise = {"noise_file": str(job.noise_file.resolve()), "noise_name": job.noise_name}
                claim(out_dir, noise, job.overwrite, [p for p in [out_dir / "hyp"] if p.is_file()])
            if (out_dir / "hyp").is_file():
                logger.info("%s exists, skipping", out_dir / "hyp")
            else:
                todo.append(modality)
        given: dict[str, dict[str, str]] = {}  # modality -> hypotheses from the audio-visual pass
        for modality in todo:
            if modality in given:
                hyps = given[modality]
                rest = [u for u in utts if u.utt_id not in hyps]  # failed in the audio-visual pass
                failed: dict[str, str] = {}
                audio_only: dict[str, str] = {}
                if rest:
                    more, failed, _, audio_only = _transcribe(job, modality, cond, snr, rest, cache)
                    hyps = {**hyps, **more}
                logger.info("%s/%s/%s: %d utterances from the audio-visual pass's %s view", job.test_set,
                            modality, cond, len(given[modality]), modality)
            elif modality == "video" and video_hyps is not None and not edges:  # the noise does not reach it
                hyps, failed = video_hyps
                audio_only = {}
            else:
                views = [m for m in from_views if m in todo] if modality == "audiovisual" else []
                hyps, failed, got, audio_only = _transcribe(job, modality, cond, snr, utts, cache, views)
                given.update(got)
            if modality == "video":
                video_hyps = hyps, failed
            _write_condition(root / modality / cond, refs, hyps, failed, audio_only)


def _transcribe(job: DecodeJob, modality: str, cond: str, snr: float | None, utts: list[Utterance],
                cache: dict[str, torch.Tensor] | None, views: Sequence[str] = ()
                ) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, str]], dict[str, str]]:
    """``(hyps, failed, view_hyps, audio_only)`` of ``utts`` in one modality and condition: ``utt-id -> text``
    of those decoded, ``utt-id -> reason`` of those that failed, with ``views`` (audio-visual input) the
    named views' hypotheses of the utterances decoded (``{view: {utt-id: text}}``, else empty), and
    ``utt-id -> reason`` of the audio-visual utterances decoded audio-only because their video could not be
    used (``Transcript.info["video_fallback"]``; counted in the log)."""
    t0 = time.time()
    results = job.transcriber.transcribe_batch(  # the model is loaded on first use
        utts, modality=modality, noise=job.noise_file if snr is not None else None, snr_db=snr,
        word_timings=False, video_cache=cache, progress=True, views=bool(views))
    hyps = {r.key: r.text for r in results if r.ok}
    failed = {r.key: r.error for r in results if not r.ok}
    logger.info("%s/%s/%s: %d utterances in %.1f s (%d failed)", job.test_set, modality, cond, len(hyps),
                time.time() - t0, len(failed))
    audio_only = {r.key: r.info["video_fallback"] for r in results if r.ok and "video_fallback" in r.info}
    if audio_only:
        first = min(audio_only)
        logger.warning("%s/%s/%s: %d of %d utterances decoded audio-only: their video could not be used "
                       "(listed in audio_only; the first: %s: %s)", job.test_set, modality, cond,
                       len(audio_only), len(results), first, audio_only[first])
    given = {v: {r.key: r.views[v].text for r in results if r.ok and r.views and v in r.views} for v in views}
    return hyps, failed, given, audio_only


def _write_condition(out_dir: Path, refs: dict[str, str], hyps: dict[str, str], failed: dict[str, str],
                     audio_only: dict[str, str]) -> None:
    """``ref``, ``failed`` and ``audio_only`` (each removed when empty) and last ``hyp`` (its presence marks
    the condition as done) of one condition, each atomic and sorted by key."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_kaldi_map(out_dir / "ref", refs)
    for name, entries in (("failed", failed), ("audio_only", audio_only)):
        if entries:
            write_kaldi_map(out_dir / name, entries)
        else:
            (out_dir / name).unlink(missing_ok=True)
    write_kaldi_map(out_dir / "hyp", hyps)
