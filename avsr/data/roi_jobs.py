"""The ROI batch job: mouth ROIs (96x96 gray 25 fps mp4) and 16 kHz mono wavs of many raw face videos, in
parallel and resumable -- what ``avsr-preprocess-roi`` runs (:mod:`avsr.bin.preprocess_roi` for the options).

The work is a directory of videos (:func:`scan_dir`: every ``<src-dir>/<rel>.<ext>`` gives
``<dst-dir>/<rel>.mp4`` and ``<dst-dir>/<rel>.wav``) or a work list (:func:`read_list`), one video per line:
``<src>`` (relative to ``--src-dir``, whose layout is kept), or ``<src> <dst.mp4>`` (the output relative to
``--dst-dir``), or ``<src> <dst.mp4> <start_s> <end_s>`` to keep only that part (``end_s`` -1: to the end;
the pieces of long LRS3 ``pretrain`` clips, see :mod:`avsr.data.lrs3`); relative ``<src>`` paths are taken
from ``--src-dir`` if given, else from the current directory.

With a landmarks directory the landmarks are not detected but read from ``<DIR>/<rel>.pkl`` (or ``.npy``),
``<rel>`` being the source video's path relative to ``--src-dir`` without its suffix (:func:`landmark_file`):
the layout of AV-HuBERT's ``detect_landmark.py`` (``--landmark``), so that the published LRS3 / VoxCeleb2
landmarks give the original's crops (:func:`avsr.data.roi.load_landmarks`; a segment of a list uses its
frames of the whole video's landmarks). A video without a landmark file fails (``failed.tsv``).

Outputs are written atomically (wav, then mp4), so a run can be stopped at any time and run again: a video
whose two outputs exist is skipped. A video that fails (unreadable, no face, no audio) is logged with the
reason and listed in ``<dst-dir>/failed.tsv`` (``path<TAB>reason``, path as given: relative to
``--src-dir`` or as in the list), and the others go on (:func:`preprocess_dir`). One video is
:func:`avsr.data.roi.preprocess_video`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from avsr.fileio import write_text_atomic

__all__ = ["Job", "read_list", "scan_dir", "outputs", "landmark_file", "preprocess_dir", "find_jobs"]

logger = logging.getLogger("avsr.bin.preprocess_roi")  # the tool's log name, kept


@dataclass(frozen=True)
class Job:
    """One video to preprocess: ``src`` -> ``<dst-dir>/<dst>`` (``.mp4``, and the ``.wav`` beside it).

    ``name`` is the video as the user gave it (for logs and failed.tsv); ``start_s`` / ``end_s`` the part to
    keep (seconds; ``end_s`` None: to the end).
    """

    src: str
    dst: str
    name: str
    start_s: float = 0.0
    end_s: float | None = None


def _relative_dst(text: str, where: str) -> str:
    """A ``.mp4`` path relative to --dst-dir that stays inside it, else ValueError naming ``where``."""
    dst = PurePosixPath(text)
    if dst.is_absolute() or ".." in dst.parts or dst.suffix != ".mp4":
        raise ValueError(f"{where}: the output {text} must be a relative .mp4 path inside --dst-dir")
    return dst.as_posix()


def read_list(list_file: str | os.PathLike, src_dir: Path | None) -> list[Job]:
    """The jobs of a work list (see the module docstring).

    Raises:
        ValueError: a line with another number of fields, a bad number, an output outside --dst-dir, a
            one-field line without --src-dir or outside it, two lines with the same output (names the line).
    """
    jobs, seen = [], {}
    for number, line in enumerate(Path(list_file).read_text().splitlines(), 1):
        fields, where = line.split(), f"{list_file}:{number}"
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) not in (1, 2, 4):
            raise ValueError(f"{where}: expected <src> [<dst.mp4> [<start_s> <end_s>]], got {line!r}")
        src = Path(fields[0]) if src_dir is None else src_dir / fields[0]
        if len(fields) == 1:
            if src_dir is None:
                raise ValueError(f"{where}: a line with only <src> needs --src-dir (its layout is kept)")
            try:
                rel = src.resolve().relative_to(src_dir.resolve())
            except ValueError:
                raise ValueError(f"{where}: {fields[0]} is not inside --src-dir {src_dir}") from None
            dst = rel.with_suffix(".mp4").as_posix()
        else:
            dst = _relative_dst(fields[1], where)
        start, end = 0.0, None
        if len(fields) == 4:
            try:
                start, end = float(fields[2]), float(fields[3])
            except ValueError:
                raise ValueError(f"{where}: <start_s> <end_s> must be numbers, got {fields[2:]}") from None
            end = None if end < 0 else end
        if dst in seen:
            raise ValueError(f"{where}: the output {dst} is already written by line {seen[dst]}")
        seen[dst] = number
        jobs.append(Job(str(src), dst, fields[0], start, end))
    return jobs


def scan_dir(src_dir: Path, dst_dir: Path, exts: list[str]) -> list[Job]:
    """A job for every ``*.<ext>`` file under ``src_dir`` (not hidden, not under ``dst_dir``), sorted."""
    dst = dst_dir.resolve()
    found = set()
    for ext in exts:
        for path in src_dir.rglob(f"*.{ext}"):
            if not path.name.startswith(".") and dst not in path.resolve().parents:
                found.add(path.relative_to(src_dir))
    return [
        Job(str(src_dir / rel), rel.with_suffix(".mp4").as_posix(), rel.as_posix()) for rel in sorted(found)
    ]


def outputs(dst_dir: Path, job: Job) -> tuple[Path, Path]:
    """``(<dst-dir>/<dst>.mp4, <dst-dir>/<dst>.wav)``."""
    mp4 = dst_dir / job.dst
    return mp4, mp4.with_suffix(".wav")


def _init_worker() -> None:
    """One thread per worker process (the processes are the parallelism)."""
    import torch

    torch.set_num_threads(1)


def _reason(exc: BaseException) -> str:
    """``<Type>: <message>`` of a failed video, on one line (for the log and failed.tsv)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())  # one line


def landmark_file(landmarks_dir: str | os.PathLike, job: Job, src_dir: str | os.PathLike | None) -> Path:
    """The landmark file of a job: ``<landmarks_dir>/<source relative to src_dir, no suffix>.pkl``, or the
    ``.npy`` beside it when only that exists (see the module docstring).

    Raises:
        ValueError: the source is an absolute path outside ``src_dir`` (or there is no ``src_dir``), or its
            relative path leaves the landmark directory.
    """
    name = Path(job.name)
    if name.is_absolute():
        if src_dir is None:
            raise ValueError(
                f"{job.name}: an absolute path needs --src-dir to find its file in --landmarks-dir"
            )
        inside = [
            Path(src).relative_to(root)
            for src, root in (
                (os.path.abspath(name), os.path.abspath(src_dir)),
                (name.resolve(), Path(src_dir).resolve()),
            )
            if Path(src).is_relative_to(root)
        ]
        if not inside:
            raise ValueError(f"{job.name} is not inside --src-dir {src_dir}: no landmark file for it")
        name = inside[0]
    if ".." in name.parts:
        raise ValueError(f"{job.name}: its landmark file would lie outside --landmarks-dir")
    stem = str(Path(landmarks_dir) / name.with_suffix(""))
    pkl, npy = Path(stem + ".pkl"), Path(stem + ".npy")
    return npy if npy.is_file() and not pkl.is_file() else pkl


def _process(
    job: Job, dst_dir: str, smooth_window: int, landmarks_dir: str | None = None, src_dir: str | None = None
) -> tuple[Job, dict | None, str | None]:
    """Worker: preprocess one video; returns ``(job, stats, None)`` or ``(job, None, reason)``."""
    from avsr.data.roi import preprocess_video

    mp4, wav = outputs(Path(dst_dir), job)
    try:
        mp4.parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"smooth_window": smooth_window, "start_s": job.start_s, "end_s": job.end_s}
        if landmarks_dir is not None:
            kwargs["landmarks"] = landmark_file(landmarks_dir, job, src_dir)
        return job, preprocess_video(job.src, mp4, wav, **kwargs), None
    except Exception as exc:  # one bad file must not stop the others; the reason goes to failed.tsv
        return job, None, _reason(exc)


def preprocess_dir(
    dst_dir: str | os.PathLike,
    src_dir: str | os.PathLike | None = None,
    list_file: str | os.PathLike | None = None,
    exts: tuple[str, ...] = ("mp4",),
    nj: int = 1,
    smooth_window: int = 12,
    progress: bool = True,
    landmarks_dir: str | os.PathLike | None = None,
) -> dict:
    """Preprocess every video of ``list_file`` or under ``src_dir`` not done yet (see the module docstring).

    ``landmarks_dir``: read each video's landmarks from there (:func:`landmark_file`) instead of detecting
    them with MediaPipe (which then need not be installed).

    Returns:
        summary ``{"done", "skipped", "failed", "frames", "frames_without_face", "seconds" (wall time),
        "fps" (frames per second of wall time), "failures": [(name, reason)]}``.

    Raises:
        ValueError: neither ``src_dir`` nor ``list_file``, ``src_dir`` missing or equal to ``dst_dir``, a bad
            list line, ``nj < 1``.
        ImportError: MediaPipe (without ``landmarks_dir``) or scikit-image is not installed.
    """
    dst_dir = Path(dst_dir)
    src_dir = None if src_dir is None else Path(src_dir)
    jobs = find_jobs(dst_dir, src_dir, list_file, exts, nj, landmarks_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    pending = [job for job in jobs if not all(p.is_file() for p in outputs(dst_dir, job))]
    logger.info(
        "%d videos: %d to preprocess, %d already done; %d workers",
        len(jobs), len(pending), len(jobs) - len(pending), nj,
    )  # fmt: skip
    summary = {"done": 0, "skipped": len(jobs) - len(pending), "frames": 0, "frames_without_face": 0}
    failures: list[tuple[str, str]] = []
    start = time.perf_counter()
    extra = (str(dst_dir), smooth_window, None if landmarks_dir is None else str(landmarks_dir))
    extra += (None if src_dir is None else str(src_dir),)
    for job, stats, reason in _run(pending, extra, nj, progress):
        if stats is None:
            logger.error("failed: %s: %s", job.name, reason)
            failures.append((job.name, reason))
        else:
            summary["done"] += 1
            summary["frames"] += stats["frames"]
            summary["frames_without_face"] += stats["frames_without_face"]
    summary["seconds"] = time.perf_counter() - start
    summary["fps"] = summary["frames"] / max(summary["seconds"], 1e-9)
    summary["failed"] = len(failures)
    summary["failures"] = sorted(failures)
    _write_failures(dst_dir / "failed.tsv", summary["failures"])
    return summary


def find_jobs(dst_dir: Path, src_dir: Path | None, list_file: str | os.PathLike | None, exts: tuple[str, ...],
              nj: int, landmarks_dir: str | os.PathLike | None) -> list[Job]:
    """Check the options of :func:`preprocess_dir` and return its jobs (of the list, or found under
    ``src_dir``).

    Raises:
        ValueError, ImportError: as :func:`preprocess_dir`.
    """
    from avsr.data.roi import import_mediapipe, import_skimage

    import_skimage()  # fail now, with the install hint, not once per file
    if landmarks_dir is None:
        import_mediapipe()
    elif not Path(landmarks_dir).is_dir():
        raise ValueError(f"--landmarks-dir {landmarks_dir} is not a directory")
    if src_dir is not None and not src_dir.is_dir():
        raise ValueError(f"--src-dir {src_dir} is not a directory")
    if src_dir is not None and src_dir.resolve() == dst_dir.resolve():
        raise ValueError(f"--dst-dir must differ from --src-dir {src_dir}: outputs would replace the inputs")
    if nj < 1:
        raise ValueError(f"--nj must be >= 1, got {nj}")
    if list_file is not None:
        return read_list(list_file, src_dir)
    if src_dir is not None:
        return scan_dir(src_dir, dst_dir, list(exts))
    raise ValueError("give --src-dir or --list")


def _run(pending: list[Job], extra: tuple, nj: int, progress: bool
         ) -> Iterator[tuple[Job, dict | None, str | None]]:
    """The outcomes of :func:`_process` over ``pending`` (in this process, or ``nj`` spawned workers), with a
    progress bar; the workers are shut down when the caller stops."""
    with tqdm(total=len(pending), desc="mouth ROI", unit="video", disable=not progress) as bar:
        pool = None
        if nj == 1 or len(pending) <= 1:
            results = (_process(job, *extra) for job in pending)
        else:
            context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
            pool = ProcessPoolExecutor(nj, mp_context=context, initializer=_init_worker)
            futures = {pool.submit(_process, job, *extra): job for job in pending}
            results = (_result(future, futures[future]) for future in as_completed(futures))
        try:
            for outcome in results:
                yield outcome
                bar.update(1)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)


def _result(future, job: Job) -> tuple[Job, dict | None, str | None]:
    """The outcome of a worker's job; a crashed worker (BrokenProcessPool) fails the video, not the run."""
    try:
        return future.result()
    except Exception as exc:
        return job, None, _reason(exc)


def _write_failures(path: Path, failures: list[tuple[str, str]]) -> None:
    """``name<TAB>reason`` lines, atomically; no file when nothing failed (each run decides anew)."""
    if not failures:
        path.unlink(missing_ok=True)
        return
    write_text_atomic(path, "".join(f"{name}\t{reason}\n" for name, reason in failures))
