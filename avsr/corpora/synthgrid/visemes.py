"""From festival phone segments to smooth articulator trajectories at the video frame rate.

Each phone maps to a viseme target, a vector of six articulatory parameters (:data:`PARAMS`), and to two
dominance strengths, one for the opening parameters and one for the lip shape (spread, protrusion).
Trajectories follow the coarticulation model of Cohen and Massaro ("Modeling coarticulation in synthetic
visual speech", Models and Techniques in Computer Animation, 1993): every segment exerts a dominance that is
constant over the segment and decays exponentially outside it, and the value at time t is the
dominance-weighted mean of all targets. Strong dominance makes bilabial closure and labiodental contact
reach their targets even in short segments; weak dominance (k, g, ng, hh) lets those phones take the shape
of their neighbours, and lip rounding spreads to neighbouring consonants (anticipatory rounding).

As with real lips, phones of one viseme class share a target and are visually identical (p, b, m; f, v;
t, d, n; k, g, ng; ...), and several classes differ only slightly.
"""

from __future__ import annotations

import numpy as np

#: articulatory parameters, in the order of the last axis of a trajectory
PARAMS = ("open", "spread", "protrude", "teeth", "tongue", "tuck")
NUM_PARAMS = len(PARAMS)

# viseme class -> (open, spread, protrude, teeth, tongue, tuck), dominance of opening, dominance of lip shape,
# reach (multiplies the decay time of the dominance outside the segment: < 1 for brief, local gestures)
#   open: jaw/lip opening 0 (closed) .. 1 (wide);  spread: lip width -1 (narrow) .. 1 (spread);
#   protrude: rounding/protrusion 0 .. 1;  teeth, tongue: visibility 0 .. 1;
#   tuck: lower lip under the upper teeth (f, v)
_VISEMES: dict[str, tuple[tuple[float, ...], float, float, float]] = {
    "rest": ((0.00, 0.00, 0.05, 0.0, 0.0, 0.0), 0.8, 0.3, 1.0),
    "bilabial": ((-0.05, 0.00, 0.05, 0.0, 0.0, 0.0), 6.0, 0.3, 0.5),
    "labiodental": ((0.10, 0.10, 0.00, 1.0, 0.0, 1.0), 4.0, 0.4, 0.6),
    "dental": ((0.22, 0.15, 0.00, 0.8, 1.0, 0.0), 2.0, 0.4, 1.0),
    "alveolar": ((0.20, 0.20, 0.00, 0.6, 0.2, 0.0), 1.0, 0.3, 1.0),
    "lateral": ((0.30, 0.15, 0.00, 0.5, 0.6, 0.0), 1.0, 0.3, 1.0),
    "sibilant": ((0.10, 0.40, 0.00, 1.0, 0.0, 0.0), 2.0, 0.5, 1.0),
    "postalveolar": ((0.16, -0.50, 0.75, 0.8, 0.0, 0.0), 2.0, 1.5, 1.2),
    "velar": ((0.28, 0.00, 0.00, 0.3, 0.1, 0.0), 0.3, 0.1, 1.0),
    "r": ((0.20, -0.40, 0.55, 0.2, 0.0, 0.0), 1.0, 1.5, 1.0),
    "w": ((0.08, -0.90, 1.00, 0.0, 0.0, 0.0), 2.5, 3.0, 1.3),
    "y": ((0.15, 0.70, 0.00, 0.5, 0.0, 0.0), 1.0, 1.5, 1.0),
    "iy": ((0.18, 0.90, 0.00, 0.6, 0.0, 0.0), 1.0, 1.0, 1.0),
    "ih": ((0.30, 0.60, 0.00, 0.5, 0.1, 0.0), 1.0, 1.0, 1.0),
    "eh": ((0.50, 0.45, 0.00, 0.5, 0.2, 0.0), 1.0, 1.0, 1.0),
    "ae": ((0.75, 0.60, 0.00, 0.5, 0.3, 0.0), 1.0, 1.0, 1.0),
    "aa": ((1.00, 0.10, 0.00, 0.3, 0.3, 0.0), 1.0, 1.0, 1.0),
    "ah": ((0.60, 0.10, 0.00, 0.3, 0.2, 0.0), 1.0, 1.0, 1.0),
    "ax": ((0.40, 0.00, 0.00, 0.3, 0.2, 0.0), 0.6, 0.5, 1.0),
    "ao": ((0.80, -0.40, 0.50, 0.2, 0.2, 0.0), 1.0, 1.0, 1.0),
    "er": ((0.30, -0.30, 0.45, 0.3, 0.0, 0.0), 1.0, 1.0, 1.0),
    "ow": ((0.50, -0.60, 0.70, 0.1, 0.1, 0.0), 1.0, 1.2, 1.0),
    "uh": ((0.35, -0.60, 0.70, 0.1, 0.0, 0.0), 1.0, 1.2, 1.0),
    "uw": ((0.22, -1.00, 1.00, 0.0, 0.0, 0.0), 1.0, 1.5, 1.0),
}

# festival phone (CMU/radio phone set) -> one viseme, or two for diphthongs (first and second half)
# fmt: off
PHONE_TO_VISEMES: dict[str, tuple[str, ...]] = {
    "pau": ("rest",), "h#": ("rest",), "brth": ("rest",),
    "p": ("bilabial",), "b": ("bilabial",), "m": ("bilabial",),
    "f": ("labiodental",), "v": ("labiodental",),
    "th": ("dental",), "dh": ("dental",),
    "t": ("alveolar",), "d": ("alveolar",), "n": ("alveolar",),
    "l": ("lateral",), "s": ("sibilant",), "z": ("sibilant",),
    "sh": ("postalveolar",), "zh": ("postalveolar",), "ch": ("postalveolar",), "jh": ("postalveolar",),
    "k": ("velar",), "g": ("velar",), "ng": ("velar",), "hh": ("velar",),
    "r": ("r",), "w": ("w",), "y": ("y",),
    "iy": ("iy",), "ih": ("ih",), "eh": ("eh",), "ae": ("ae",), "aa": ("aa",), "ah": ("ah",),
    "ax": ("ax",), "ao": ("ao",), "er": ("er",), "axr": ("er",), "uh": ("uh",), "uw": ("uw",),
    "ey": ("eh", "iy"), "ay": ("aa", "iy"), "aw": ("aa", "uw"), "oy": ("ao", "iy"), "ow": ("ow", "uw"),
}
# fmt: on

_OPEN_DIMS = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=np.float32)  # dims ruled by the opening dominance


def viseme_of(phone: str) -> tuple[str, ...]:
    """The viseme class(es) of a festival phone (two for a diphthong).

    Raises:
        ValueError: unknown phone (names it).
    """
    try:
        return PHONE_TO_VISEMES[phone]
    except KeyError:
        raise ValueError(f"phone {phone!r} has no viseme (known: {sorted(PHONE_TO_VISEMES)})") from None


def viseme_segments(
    segments: list[tuple[float, float, str]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Expand phone segments into viseme segments with targets and dominances.

    Args:
        segments: ``(start_s, end_s, phone)`` in seconds.

    Returns:
        ``bounds`` float32 ``(K, 2)`` start/end in seconds, ``targets`` float32 ``(K, 6)``, ``dominance``
        float32 ``(K, 6)``, ``reach`` float32 ``(K,)`` decay-time factors (K >= number of segments;
        diphthongs split in two halves).

    Raises:
        ValueError: an unknown phone, or no segment.
    """
    bounds, targets, dominance, reach = [], [], [], []
    for start, end, phone in segments:
        classes = viseme_of(phone)
        step = (end - start) / len(classes)
        for i, name in enumerate(classes):
            target, dom_open, dom_lip, factor = _VISEMES[name]
            bounds.append((start + i * step, start + (i + 1) * step))
            targets.append(target)
            dominance.append(_OPEN_DIMS * dom_open + (1.0 - _OPEN_DIMS) * dom_lip)
            reach.append(factor)
    if not bounds:
        raise ValueError("no phone segment to render")
    return (
        np.asarray(bounds, dtype=np.float32),
        np.asarray(targets, dtype=np.float32),
        np.asarray(dominance, dtype=np.float32),
        np.asarray(reach, dtype=np.float32),
    )


def trajectory(
    segments: list[tuple[float, float, str]],
    num_frames: int,
    fps: float = 25.0,
    coarticulation_s: float = 0.035,
    target_jitter: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Articulatory parameters sampled at the video frame centres.

    Args:
        segments: phone segments ``(start_s, end_s, phone)``.
        num_frames: number of video frames T; frame i is sampled at ``(i + 0.5) / fps`` seconds.
        fps: video frame rate in frames per second.
        coarticulation_s: decay time constant (seconds) of a segment's dominance outside the segment.
        target_jitter: standard deviation of Gaussian noise added to each segment's target (token-to-token
            variation of articulation); needs ``rng``.
        rng: random generator for the jitter.

    Returns:
        float32 ``(T, 6)`` in the order of :data:`PARAMS`.

    Raises:
        ValueError: an unknown phone, no segment, or ``num_frames < 1``.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    bounds, targets, dominance, reach = viseme_segments(segments)
    if target_jitter > 0.0:
        if rng is None:
            raise ValueError("target_jitter > 0 needs a random generator")
        targets = targets + rng.normal(0.0, target_jitter, size=targets.shape).astype(np.float32)
    times = (np.arange(num_frames, dtype=np.float32) + 0.5) / fps  # (T,)
    centre = bounds.mean(axis=1)  # (K,)
    half = 0.5 * (bounds[:, 1] - bounds[:, 0])  # (K,)
    outside = np.maximum(np.abs(times[:, None] - centre[None, :]) - half[None, :], 0.0)  # (T, K)
    outside = outside / (coarticulation_s * reach[None, :])
    outside -= outside.min(axis=1, keepdims=True)  # the weights are a ratio: avoids underflow far from speech
    weight = np.exp(-outside)[:, :, None] * dominance[None, :, :]  # (T, K, 6)
    return ((weight * targets[None]).sum(axis=1) / weight.sum(axis=1)).astype(np.float32)
