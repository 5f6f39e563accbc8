"""The video front-end's output of one utterance under several changes of its edges, computed once.

The recipe's decoding stage decodes every utterance of a test set in several noise conditions, and the
Transcriber brings each input's silent edges to the model's training edges (``edge_frames``), which it finds
in the audio as mixed (:func:`avsr.inference.segments.edge_change`). The same video is therefore decoded with
different numbers of frames added (copies of the edge frame) or removed at its two ends, one version per
condition. The video front-end (AV-HuBERT's ResNet-18 with a 3-D stem, :class:`avsr.nn.resnet.ResEncoder`,
then a linear projection) mixes neighbouring frames only in the stem, whose temporal kernel reaches
``radius`` frames to each side (2 of AV-HuBERT's kernel of 5, zero padding at the ends); every later layer
works frame by frame, and in eval mode no frame depends on the rest of the batch. A frame whose stem window
holds the same original frames in two versions has the same output in both, so a version can be made from a
cached one and the front-end's output of short clips at its two ends (:func:`reuse_plan`,
:func:`video_features`).
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = ["VersionKey", "version_key", "stem_radius", "reuse_plan", "video_features"]

Change = tuple[int, int]
VersionKey = tuple[Hashable, Change]


def version_key(video_id: Hashable, change: Change | None) -> VersionKey:
    """The video cache's key of the frames ``video_id`` names (:attr:`avsr.inference.types.Media.video_id`:
    an item's key, or ``(key, start, stop)`` for a segment of it) with the item's edges changed by ``change``
    (``(start, end)`` frames added (+) or removed (-); None: as read): ``(video_id, change)``. A tuple, so
    that no key of one item can equal the key of another item's version or segment, whatever the keys'
    characters."""
    return video_id, (0, 0) if change is None else (int(change[0]), int(change[1]))


def _cached_versions(cache: MutableMapping[VersionKey, torch.Tensor], ids: set[Hashable]
                     ) -> dict[Hashable, list[Change]]:
    """For each video id of ``ids``: the changes of its versions in ``cache``."""
    found: dict[Hashable, list[Change]] = {}
    for video_id, change in cache:
        if video_id in ids:
            found.setdefault(video_id, []).append(change)
    return found


def stem_radius(model: torch.nn.Module) -> int | None:
    """How many frames to each side the video front-end of ``model`` (an :class:`avsr.models.AVSRModel` or
    an :class:`avsr.encoder.AVHubertEncoder`) mixes: the temporal half-width of its 3-D stem, when the stem
    zero-pads by exactly that much (AV-HuBERT's: 2); None when the model has no such front-end."""
    encoder = getattr(model, "encoder", model)
    try:
        conv = encoder.feature_extractor_video.resnet.frontend3D[0]
    except (AttributeError, IndexError, TypeError):
        return None
    if not isinstance(conv, torch.nn.Conv3d) or conv.stride[0] != 1 or conv.dilation[0] != 1:
        return None
    radius = conv.kernel_size[0] // 2
    return radius if conv.padding[0] == radius and conv.kernel_size[0] % 2 == 1 else None


def reuse_plan(num_frames: int, cached: Change, wanted: Change, radius: int
               ) -> tuple[int, int, int] | None:
    """Which frames of a version of a video can be taken from another version.

    Args:
        num_frames: frames of the video as read (before any change).
        cached, wanted: ``(start, end)`` changes of the cached and of the wanted version (frames added (+) as
            copies of the edge frame, or removed (-), at each end; :func:`avsr.features.shift_edges`).
        radius: the stem's temporal half-width (:func:`stem_radius`).

    Returns:
        ``(first, stop, offset)``: the wanted version's frames ``first .. stop - 1`` equal the cached
        version's frames ``first + offset .. stop + offset - 1`` (their stem windows hold the same original
        frames); None when no frame can be taken. The frames before ``first`` and from ``stop`` on need the
        front-end (a clip from the start up to ``first + radius``, and one from ``stop - radius`` to the end,
        hold their windows).
    """
    lo = max(0, -cached[0], -wanted[0])  # the original frames both versions hold: lo .. hi - 1
    hi = num_frames - max(0, -cached[1], -wanted[1])
    j0, j1 = lo + radius, hi - radius  # original frames whose whole window lies in both
    if j1 <= j0:
        return None
    return j0 + wanted[0], j1 + wanted[0], cached[0] - wanted[0]


def video_features(
    encode_video,
    video: torch.Tensor,
    lengths: Sequence[int],
    keys: Sequence[Hashable],
    changes: Sequence[Change | None],
    cache: MutableMapping[VersionKey, torch.Tensor],
    radius: int | None,
) -> list[torch.Tensor]:
    """The front-end's output of a batch of videos, each made from the cached version of the same video that
    holds most of its frames, where there is one (:func:`reuse_plan`), and stored in ``cache``.

    Args:
        encode_video: ``(video (n, 1, T, H, W), lengths (n,)) -> (n, D, T)``, the model's video front-end
            (:meth:`avsr.encoder.AVHubertEncoder.encode_video`, under the caller's precision).
        video: ``(b, 1, T, H, W)`` float normalised frames of the ``b`` videos, zero-padded.
        lengths: ``b`` valid frame counts (after the change of the edges).
        keys: ``b`` identities of the frames as read (:attr:`avsr.inference.types.Media.video_id`: the item
            key, or ``(key, start, stop)`` for a segment), without the change.  changes: ``b`` changes of the
            edges made (None: none).
        cache: the caller's video cache (:meth:`avsr.inference.Transcriber.transcribe_batch`): ``(D, T)``
            float32 CPU tensors under :func:`version_key`; each video's output is stored under its key.
        radius: the stem's temporal half-width (:func:`stem_radius`); None: nothing is reused.

    Returns:
        ``b`` tensors ``(D, lengths[i])`` float32 on the CPU.
    """
    changes = [c or (0, 0) for c in changes]
    versions = _cached_versions(cache, set(keys)) if radius is not None else {}
    clips: list[tuple[int, int, int]] = []  # (video, first frame, stop frame) run through the front-end
    # per video: (first, stop, offset, cached key, start clip, end clip), or the clip of the whole video
    plans: list[tuple[int, int, int, VersionKey, int | None, int | None] | int] = []
    for i, (key, change, n) in enumerate(zip(keys, changes, lengths)):
        plan, old_key = None, None
        for old_change in versions.get(key, []):  # the version that gives most of the frames
            p = reuse_plan(n - change[0] - change[1], old_change, change, radius)
            if p is not None and (plan is None or p[1] - p[0] > plan[1] - plan[0]):
                plan, old_key = p, version_key(key, old_change)
        if plan is None:
            plans.append(len(clips))
            clips.append((i, 0, n))
            continue
        first, stop, offset = plan
        head = tail = None
        if first > 0:
            head = len(clips)
            clips.append((i, 0, min(n, first + radius)))
        if stop < n:
            tail = len(clips)
            clips.append((i, max(0, stop - radius), n))
        plans.append((first, stop, offset, old_key, head, tail))
    feats = None
    if clips:
        frames = pad_sequence([video[i, 0, a:b] for i, a, b in clips], batch_first=True).unsqueeze(1)
        clip_lens = torch.tensor([b - a for _, a, b in clips], dtype=torch.long, device=video.device)
        feats = encode_video(frames, clip_lens).float().cpu()
    out = []
    for i, (key, change, plan) in enumerate(zip(keys, changes, plans)):
        if isinstance(plan, int):
            feat = feats[plan, :, : lengths[i]]
        else:
            first, stop, offset, old_key, head, tail = plan
            parts = [] if head is None else [feats[head, :, :first]]
            parts.append(cache[old_key][:, first + offset : stop + offset])
            if tail is not None:
                a = clips[tail][1]
                parts.append(feats[tail, :, stop - a : lengths[i] - a])
            feat = torch.cat(parts, dim=1)
        feat = feat.clone()  # not a view of the batch's output, which the cache would keep alive
        cache[version_key(key, change)] = feat
        out.append(feat)
    return out
