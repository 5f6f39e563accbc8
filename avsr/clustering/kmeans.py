"""k-means on dumped features (HuBERT / AV-HuBERT ``learn_kmeans.py`` and ``dump_km_label.py``).

:func:`fit_kmeans` fits scikit-learn's ``MiniBatchKMeans`` on a random subset of the feature shards with the
original's settings by default (k-means++ init, ``max_iter`` 100, ``batch_size`` 10000, ``tol`` 0,
``max_no_improvement`` 100, ``n_init`` 20, ``reassignment_ratio`` 0, ``init_size`` None, seed 0) and saves it
with joblib (atomically) plus a ``.json`` summary beside it. :func:`apply_kmeans` gives every frame the index
of its nearest centre (squared Euclidean distance, computed in chunks with torch as the original's
``ApplyKmeans``) and :func:`write_kmeans_labels` writes one label file per data dir (see
:mod:`avsr.clustering.labels`). The published AV-HuBERT recipe fits on 10% of the utterances
(``--percent 0.1``); MFCC clustering uses K=100 in the first iteration, later iterations cluster a
transformer layer's output with K=500..2000.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avsr.clustering.labels import write_label_meta, write_labels
from avsr.clustering.shards import FeatureDumpError, FeatureShard, find_shards, read_shard
from avsr.data.datadir import read_datadir
from avsr.fileio import atomic_path, write_text_atomic

__all__ = [
    "KMeansConfig", "sample_features", "fit_kmeans", "fit_kmeans_on_shards", "load_kmeans", "apply_kmeans",
    "write_kmeans_labels",
]

logger = logging.getLogger("avsr.clustering.kmeans")


@dataclass
class KMeansConfig:
    """``MiniBatchKMeans`` settings; defaults are ``learn_kmeans.py``'s (K defaults to 100, the first
    iteration's).

    Fields: n_clusters (K), init, max_iter, batch_size, tol, max_no_improvement, n_init, reassignment_ratio
    (scikit-learn's meaning), seed (``random_state`` and the subset sampling).
    """

    n_clusters: int = 100
    init: str = "k-means++"
    max_iter: int = 100
    batch_size: int = 10000
    tol: float = 0.0
    max_no_improvement: int = 100
    n_init: int = 20
    reassignment_ratio: float = 0.0
    seed: int = 0


def sample_features(shards: Sequence[FeatureShard], percent: float = -1.0, max_frames: int | None = None,
                    seed: int = 0) -> np.ndarray:
    """A random subset of the frames of ``shards`` for fitting.

    Args:
        shards: from :func:`avsr.clustering.shards.read_shard`.
        percent: fraction in (0, 1] of the utterances of each shard to take (``ceil(num_utts * percent)``
            drawn without replacement, as the original); negative takes all.
        max_frames: at most this many frames, drawn uniformly without replacement from the frames left by
            ``percent``; None for no limit.
        seed: random seed.

    Returns:
        float32 ``(N, D)``.

    Raises:
        ValueError: ``percent`` above 1 or 0, ``max_frames`` < 1, or shards of different dimensions.
    """
    if percent == 0 or percent > 1:
        raise ValueError(f"percent must be in (0, 1] or negative (all), got {percent}")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be positive, got {max_frames}")
    dims = {s.feats.shape[1] for s in shards}
    if len(dims) != 1:
        raise ValueError(f"feature shards have different dimensions {sorted(dims)}")
    rng = np.random.default_rng(seed)
    rows: list[np.ndarray] = []
    for s in shards:
        if percent < 0:
            rows.append(np.arange(s.feats.shape[0]))
            continue
        n = len(s.lengths)
        chosen = np.sort(rng.choice(n, int(np.ceil(n * percent)), replace=False))
        offsets = s.offsets()
        rows.append(np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in chosen]))
    total = sum(len(r) for r in rows)
    if max_frames is not None and total > max_frames:
        keep = np.sort(rng.choice(total, max_frames, replace=False))
        bounds = np.cumsum([0] + [len(r) for r in rows])
        rows = [r[keep[(keep >= lo) & (keep < hi)] - lo] for r, lo, hi in zip(rows, bounds[:-1], bounds[1:])]
    feats = np.concatenate([np.asarray(s.feats[r], dtype=np.float32) for s, r in zip(shards, rows)])
    logger.info("sampled %d of %d frames from %d shards", len(feats), sum(s.feats.shape[0] for s in shards),
                len(shards))
    return feats


def fit_kmeans(feats: np.ndarray, km_path: str | os.PathLike, config: KMeansConfig | None = None,
               info: dict[str, Any] | None = None, verbose: int = 0) -> Any:
    """Fit ``MiniBatchKMeans`` and save it with joblib to ``km_path`` (atomically), with a summary
    ``<km_path>.json`` (config, ``dim``, ``num_fit_frames``, ``inertia_per_frame`` and ``info``, e.g. the
    features' ``features`` description and ``rate``).

    Args:
        feats: float32 ``(N, D)`` training frames, ``N >= n_clusters``.
        km_path: output file (conventionally ``km.joblib``).
        config: settings (default :class:`KMeansConfig`).
        info: extra metadata for the summary.
        verbose: scikit-learn's verbosity.

    Returns:
        the fitted ``sklearn.cluster.MiniBatchKMeans``.

    Raises:
        ValueError: fewer frames than clusters, or non-finite features.
    """
    import joblib
    from sklearn.cluster import MiniBatchKMeans

    config = config or KMeansConfig()
    if feats.ndim != 2 or len(feats) < config.n_clusters:
        raise ValueError(f"k-means with {config.n_clusters} clusters needs at least as many frames, got "
                         f"features of shape {feats.shape}")
    if not np.isfinite(feats).all():
        raise ValueError("k-means features have NaN or infinite values")
    km = MiniBatchKMeans(
        n_clusters=config.n_clusters, init=config.init, max_iter=config.max_iter,
        batch_size=config.batch_size, tol=config.tol, max_no_improvement=config.max_no_improvement,
        n_init=config.n_init, reassignment_ratio=config.reassignment_ratio, init_size=None,
        compute_labels=False, random_state=config.seed, verbose=verbose,
    )
    km.fit(feats)
    inertia = -km.score(feats) / len(feats)
    km_path = Path(km_path)
    km_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(km_path) as tmp:
        joblib.dump(km, tmp)
    summary = {**asdict(config), "dim": int(feats.shape[1]), "num_fit_frames": int(len(feats)),
               "inertia_per_frame": float(inertia), **(info or {})}
    write_text_atomic(km_path.with_name(km_path.name + ".json"), json.dumps(summary, indent=1) + "\n")
    logger.info("k-means K=%d on %d frames of dim %d: inertia per frame %.5f -> %s", config.n_clusters,
                len(feats), feats.shape[1], inertia, km_path)
    return km


def fit_kmeans_on_shards(feat_dir: str | os.PathLike, split: str, km_path: str | os.PathLike,
                         config: KMeansConfig | None = None, percent: float = -1.0,
                         max_frames: int | None = None, verbose: int = 0) -> Any:
    """Fit k-means on a sample of the feature shards ``<feat_dir>/<split>_*_*`` (``avsr-kmeans fit``).

    The frames are drawn by :func:`sample_features` (``percent`` of each shard's utterances, negative: all;
    at most ``max_frames``; seeded by ``config.seed``) and the model saved by :func:`fit_kmeans`, its summary
    naming the features, their rate (Hz) and where they came from.

    Returns:
        the fitted ``sklearn.cluster.MiniBatchKMeans``.

    Raises:
        FeatureDumpError: no shards, unreadable shards, or shards of different features.
        ValueError: as :func:`fit_kmeans`.
    """
    config = config or KMeansConfig()
    shards = [read_shard(p) for p in find_shards(feat_dir, split)]
    described = {(s.info["features"], s.info["rate"]) for s in shards}
    if len(described) != 1:
        raise FeatureDumpError(f"{feat_dir}: shards of {split} hold different features {sorted(described)}")
    features, rate = described.pop()
    feats = sample_features(shards, percent, max_frames, config.seed)
    info = {"features": features, "rate": rate, "feat_dir": str(feat_dir), "split": split, "percent": percent,
            "max_frames": max_frames}
    return fit_kmeans(feats, km_path, config, info, verbose=verbose)


def load_kmeans(km_path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """The centres of a saved k-means model and its summary.

    Returns:
        ``(centres float32 (K, D), summary dict)`` (the summary is ``{}`` when ``<km_path>.json`` is absent).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds no fitted k-means model (named).
    """
    import joblib

    km_path = Path(km_path)
    if not km_path.is_file():
        raise FileNotFoundError(f"k-means model not found: {km_path}")
    km = joblib.load(km_path)
    centres = getattr(km, "cluster_centers_", None)
    if centres is None:
        raise ValueError(f"{km_path} holds no fitted k-means model ({type(km).__name__})")
    meta = km_path.with_name(km_path.name + ".json")
    summary = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    return np.asarray(centres, dtype=np.float32), summary


def apply_kmeans(feats: np.ndarray | torch.Tensor, centres: np.ndarray | torch.Tensor, chunk: int = 65536,
                 device: str | torch.device = "cpu") -> np.ndarray:
    """Index of the nearest centre of every frame (squared Euclidean distance, float32).

    Args:
        feats: ``(N, D)``.
        centres: ``(K, D)``.
        chunk: frames per matrix product (bounds memory to ``chunk x K`` floats).
        device: where to compute.

    Returns:
        int64 ``(N,)`` in ``0..K-1``.

    Raises:
        ValueError: dimensions differ.
    """
    c = torch.as_tensor(np.asarray(centres, dtype=np.float32)).to(device)
    if feats.ndim != 2 or feats.shape[1] != c.shape[1]:
        raise ValueError(
            f"features of shape {tuple(feats.shape)} do not fit centres of shape {tuple(c.shape)}"
        )
    c_norm = c.pow(2).sum(1)
    out = np.empty(feats.shape[0], dtype=np.int64)
    for start in range(0, feats.shape[0], chunk):
        x = torch.from_numpy(np.array(feats[start : start + chunk], dtype=np.float32)).to(device)
        dist = x.pow(2).sum(1, keepdim=True) - 2.0 * x @ c.T + c_norm
        out[start : start + x.shape[0]] = dist.argmin(1).cpu().numpy()
    return out


def write_kmeans_labels(shard_prefixes: Sequence[str | os.PathLike], km_path: str | os.PathLike,
                        data_dir: str | os.PathLike, name: str = "km", device: str | torch.device = "cpu"
                        ) -> Path:
    """Label every frame of the feature shards of a data dir and write ``<data_dir>/<name>.km`` and its
    ``.km.json`` (label rate from the shards, K from the model, the features' description, the model's
    absolute path).

    Args:
        shard_prefixes: all shards of the data dir (:func:`avsr.clustering.shards.find_shards`).
        km_path: the model from :func:`fit_kmeans`.
        data_dir: the data dir the features were dumped from.
        name: label file name without ``.km``.
        device: where the distances are computed.

    Returns:
        the label file's path.

    Raises:
        FeatureDumpError: the shards hold other features than the model was fit on, or do not cover exactly
            the utterances of the data dir (one named).
        avsr.data.datadir.DataDirError: bad data dir.
    """
    centres, summary = load_kmeans(km_path)
    data_dir = Path(data_dir)
    utt_ids = {u.utt_id for u in read_datadir(data_dir, require_text=False)}
    labels: dict[str, np.ndarray] = {}
    infos = []
    for prefix in shard_prefixes:
        shard = read_shard(prefix)
        info = shard.info
        if summary.get("features") not in (None, info["features"]):
            raise FeatureDumpError(f"{prefix}: features '{info['features']}' but {km_path} was fit on "
                                   f"'{summary['features']}'")
        infos.append(info)
        offsets = shard.offsets()
        flat = apply_kmeans(shard.feats, centres, device=device)
        for i, utt in enumerate(shard.utt_ids):
            if utt not in utt_ids:
                raise FeatureDumpError(f"{prefix}: utterance '{utt}' is not in data dir {data_dir}")
            labels[utt] = flat[offsets[i] : offsets[i + 1]]
    missing = sorted(utt_ids - set(labels))
    if missing:
        raise FeatureDumpError(f"{data_dir}: utterance '{missing[0]}' has no features in the shards "
                               f"({len(missing)} in all)")
    rates = {info["rate"] for info in infos}
    if len(rates) != 1:
        raise FeatureDumpError(f"shards of {data_dir} have different rates {sorted(rates)}")
    out = data_dir / f"{name}.km"
    write_labels(out, labels)
    write_label_meta(out, label_rate=rates.pop(), num_classes=len(centres), features=infos[0]["features"],
                     kmeans_model=str(Path(km_path).resolve()))
    logger.info("%s: %d utterances, %d frames, K=%d", out, len(labels), sum(map(len, labels.values())),
                len(centres))
    return out
