"""Decode a test set under every modality and noise condition (the recipe's decoding stage).

For each modality (``audio``, ``video``, ``audiovisual``) and condition (``clean``, then ``<noise>_<snr>`` for
each SNR when a noise file is given) the tool writes ``<out>/<test_set>/<modality>/<condition>/hyp`` and
``ref`` (Kaldi text: ``<utt-id> WORDS``), each atomically, and ``failed`` (``<utt-id> <reason>``) when some
utterances could not be decoded (they are reported and skipped, the others decoded). A condition whose ``hyp``
exists is skipped, so an interrupted decoding resumes -- when the settings match: each modality directory
records them in ``decode_settings.yaml`` (model, checkpoints chosen with their sizes and times, tokenizer,
decoding configuration, data dir, precision; each noisy condition its noise file), and a directory holding
results made with other settings is refused with the differing keys named, or cleared and decoded anew with
``--overwrite``. All decoding goes through :class:`avsr.inference.Transcriber` (the same path as ``avsr
transcribe`` and Python users): the noise segment and the SNR of an utterance are a function of its id, so
every run decodes the same noisy audio. Each utterance gets the silent edges of the model's training audio
where its audio, as mixed for the condition, shows them (``--edge-frames``, the Transcriber's
``edge_frames``; recorded in ``decode_settings.yaml`` when inputs are changed). Without that change,
video-only input does not depend on the audio noise: it is decoded once and its hypotheses are written for
every condition; with it, video-only input is decoded in every condition (a noisy recording hides the
edges). Audio-visual and video-only decoding run the video front-end once per utterance and change of its
edges and reuse its output in the other noise conditions (the Transcriber's ``video_cache``). Audio-visual
hypotheses are ranked with the model's single-stream views too where the decoding configuration's
``video_weight`` or ``audio_weight`` (or, when null, the model's default) is above 0; the audio-visual
directory's ``decode_settings.yaml`` then records both (``view_weights``), and the other modalities' do not.

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

Usage: ``python -m avsr.bin.decode --exp-dir exp/x --data data/test --test-set test --decode-config
conf/decode/default.yaml [--noise-file babble.wav --snrs 10 5 0 -5] --out exp/x/decode``, or
``python -m avsr.bin.decode --checkpoint large_vox_433h.pt --bpemodel spm_unigram1000.model --data data/test
--decode-config conf/decode/avhubert_s2s.yaml --out decode``
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import yaml

from avsr.bin.runner import UsageError, tool
from avsr.config import config_path, parse_yaml, to_dict
from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_kaldi_map
from avsr.decode.config import load_decode_config
from avsr.fileio import remove_stale_tmp, write_text_atomic
from avsr.inference import (
    Transcriber,
    model_defaults,
    parse_edge_frames,
)
from avsr.modalities import MODALITY_INPUTS
from avsr.nn.precision import PRECISIONS
from avsr.train.checkpoint import best_checkpoints

logger = logging.getLogger("avsr.decode")


def _file_id(path: Path) -> str:
    stat = path.stat()
    return f"{path.name} ({stat.st_size} bytes, modified {stat.st_mtime_ns})"


def _settings(args: argparse.Namespace, source: Path, bpemodel: Path | None) -> dict:
    """What the hypotheses depend on (the content of ``decode_settings.yaml``).

    Raises:
        FileNotFoundError: no checkpoint; avsr.config.ConfigError: a bad decoding configuration.
    """
    if source.is_dir():
        checkpoints = [_file_id(p) for p in best_checkpoints(source, args.average_nbest)]
    elif source.is_file():
        checkpoints = [_file_id(source)]
    else:
        raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")
    config = load_decode_config(config_path(args.decode_config, "decode"))
    decode = {"search": config.search, **to_dict(config)}
    # the views' weights are recorded below only where they change the hypotheses
    decode.pop("video_weight", None), decode.pop("audio_weight", None)
    settings = {
        "model": str(source.resolve()),
        "checkpoints": checkpoints,
        "bpemodel": str(bpemodel.resolve()) if bpemodel is not None and bpemodel.is_file() else None,
        "decode_config": decode,
        "data": str(args.data.resolve()),
        "precision": args.precision,
    }
    rescored = "audiovisual" in args.modalities and config.search == "espnet"
    defaults = (None, (0.0, 0.0))  # read from the checkpoint only when needed, once (official ones are big)
    if args.edge_frames == "model" or (rescored and None in (config.video_weight, config.audio_weight)):
        defaults = model_defaults(source, args.average_nbest)
    edges = defaults[0] if args.edge_frames == "model" else args.edge_frames
    if edges is not None:  # recorded only when inputs are changed: earlier results stay valid
        settings["edge_frames"] = [list(edges[0]), list(edges[1])]
    if rescored:
        weights = config.view_weights(defaults[1])
        if max(weights) > 0:  # audio-visual results only (see main)
            settings["view_weights"] = {"video_weight": weights[0], "audio_weight": weights[1]}
    return settings


def _claim(out: Path, settings: dict, overwrite: bool, results: list[Path]) -> None:
    """Record ``settings`` in ``out/decode_settings.yaml``; ``results`` (``hyp`` files below ``out``) made
    with other settings are refused or, with ``overwrite``, removed with their condition directories.

    Raises:
        UsageError: ``out`` holds results of other settings (the differing keys named) and no ``overwrite``.
    """
    path = out / "decode_settings.yaml"
    if path.is_file() and results:
        old = parse_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
        differ = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if differ and not overwrite:
            raise UsageError(f"{out} holds results decoded with other settings ({', '.join(differ)} differ; "
                             f"see {path}): decode into another --out, or pass --overwrite")
        if differ:
            logger.warning("%s: settings changed (%s): decoding anew", out, ", ".join(differ))
            for hyp in results:
                shutil.rmtree(hyp.parent)
    elif results and overwrite:
        for hyp in results:
            shutil.rmtree(hyp.parent)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(settings, sort_keys=True))


def check_media(utts: list[Utterance], data: Path, modalities: list[str], edges: bool) -> None:
    """Refuse a data dir whose media files for ``modalities`` are not all there (see the module docstring).

    Args:
        utts: the utterances of the data dir ``data``.
        data: the data dir (named in the message).
        modalities: the decoded modalities (keys of :data:`avsr.inference.MODALITY_INPUTS`).
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


@tool("avsr-decode")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp-dir", type=Path, default=None, help="training dir (needed without --checkpoint)")
    p.add_argument("--data", required=True, type=Path, help="test data dir")
    p.add_argument("--test-set", default=None, help="name in the results (default: data dir name)")
    p.add_argument("--decode-config", required=True, help="decoding YAML (a path or a shipped name)")
    p.add_argument("--bpemodel", type=Path, default=None, help="default: <exp-dir>/bpe.model")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="decode this checkpoint (avsr's or an official AV-HuBERT one), no averaging")
    p.add_argument("--average-nbest", type=int, default=5)
    p.add_argument("--modalities", nargs="+", default=list(MODALITY_INPUTS), choices=list(MODALITY_INPUTS))
    p.add_argument("--noise-file", type=Path, default=None)
    p.add_argument("--noise-name", default="babble")
    p.add_argument("--snrs", nargs="*", type=float, default=[10.0, 5.0, 0.0, -5.0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch-frames", type=int, default=3000)
    p.add_argument("--overwrite", action="store_true",
                   help="decode anew into a directory holding results made with other settings")
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="encoder precision (default fp32: the same WER on every machine; auto: bf16 "
                        "where the device computes it natively)")
    p.add_argument("--edge-frames", default="model",
                   help="silent 40 ms frames before and after each utterance's speech (the Transcriber's "
                   "edge_frames): 'model' (the middle half of the training audio's, when the checkpoint "
                   "records them), 'off', or START,END, each a count or a range LO-HI")
    p.add_argument("--ngpu", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1,
                   help="CPU threads (the beam search's small tensor ops run fastest on 1; run modalities in "
                   "parallel processes instead)")
    args = p.parse_args(argv)
    if args.exp_dir is None and args.checkpoint is None:
        p.error("give --exp-dir (checkpoint averaging) or --checkpoint")
    try:
        args.edge_frames = parse_edge_frames(args.edge_frames)
    except ValueError as exc:
        p.error(f"--edge-frames: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    device = torch.device("cuda" if args.ngpu > 0 else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    if device.type == "cpu":
        torch.set_num_threads(args.num_threads)
    bpemodel = args.bpemodel
    if bpemodel is None and args.exp_dir is not None:
        bpemodel = args.exp_dir / "bpe.model"
    source = args.checkpoint if args.checkpoint is not None else args.exp_dir
    settings = _settings(args, source, bpemodel)  # checks the model and the decoding config first
    test_set = args.test_set or args.data.name
    utts = read_datadir(args.data)
    check_media(utts, args.data, args.modalities, "edge_frames" in settings)
    refs = {u.utt_id: u.text for u in utts}

    for path in remove_stale_tmp(args.out / test_set, recursive=True):
        logger.info("removed %s, left by an interrupted write", path)
    conditions: list[tuple[str, float | None]] = [("clean", None)]
    if args.noise_file is not None:
        conditions += [(f"{args.noise_name}_{snr:g}", snr) for snr in args.snrs]

    transcriber: Transcriber | None = None
    for modality in args.modalities:
        out_mod = args.out / test_set / modality
        mod_settings = {k: v for k, v in settings.items() if k != "view_weights" or modality == "audiovisual"}
        _claim(out_mod, mod_settings, args.overwrite, sorted(out_mod.glob("*/hyp")))
        video_hyps: dict[str, str] | None = None
        video_failed: dict[str, str] = {}
        # with the model's training edges (found in the audio as mixed for each condition: a noisy recording
        # hides them) video-only input depends on the noise too, and is decoded in every condition
        edges = "edge_frames" in settings
        reuse_video = (modality == "audiovisual" or (modality == "video" and edges)) and len(conditions) > 1
        cache: dict[str, torch.Tensor] | None = {} if reuse_video else None
        for cond, snr in conditions:
            out_dir = out_mod / cond
            if snr is not None:  # the noise recording of a noisy condition
                noise = {"noise_file": str(args.noise_file.resolve()), "noise_name": args.noise_name}
                _claim(out_dir, noise, args.overwrite, [p for p in [out_dir / "hyp"] if p.is_file()])
            if (out_dir / "hyp").is_file():
                logger.info("%s exists, skipping", out_dir / "hyp")
                continue
            if modality == "video" and video_hyps is not None and not edges:  # the noise does not reach it
                hyps, failed = video_hyps, video_failed
            else:
                if transcriber is None:
                    transcriber = Transcriber.from_pretrained(
                        source, bpemodel=bpemodel, device=device, decode_config=args.decode_config,
                        average_nbest=args.average_nbest, precision=args.precision,
                        batch_frames=args.batch_frames, edge_frames=args.edge_frames)
                t0 = time.time()
                results = transcriber.transcribe_batch(
                    utts,
                    modality=modality,
                    noise=args.noise_file if snr is not None else None,
                    snr_db=snr,
                    word_timings=False,
                    video_cache=cache,
                    progress=True,
                )
                hyps = {r.key: r.text for r in results if r.ok}
                failed = {r.key: r.error for r in results if not r.ok}
                logger.info("%s/%s/%s: %d utterances in %.1f s (%d failed)", test_set, modality, cond,
                            len(hyps), time.time() - t0, len(failed))
                if modality == "video":
                    video_hyps, video_failed = hyps, failed
            out_dir.mkdir(parents=True, exist_ok=True)
            write_kaldi_map(out_dir / "ref", refs)  # atomic, sorted by key
            if failed:
                write_kaldi_map(out_dir / "failed", failed)
            else:
                (out_dir / "failed").unlink(missing_ok=True)
            write_kaldi_map(out_dir / "hyp", hyps)  # last: its presence marks the condition as done
    logger.info("decoding written under %s", os.fspath(args.out / test_set))


if __name__ == "__main__":
    sys.exit(main())
