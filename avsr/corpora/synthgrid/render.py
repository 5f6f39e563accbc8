"""Render a 96x96 grayscale mouth region of interest from articulator trajectories.

The mouth is a parametric 2-d shape drawn in every frame at once, numpy-vectorised over frames and pixels
(arrays of shape ``(T, H, W)``): an inner opening bounded by the inner lip contours, upper and lower lips
of speaker-dependent thickness around it, upper and lower teeth and the tongue inside the opening, a dark
mouth cavity, and skin with a fixed speaker texture and the shadows of the nose and chin. The trajectory
(:mod:`avsr.corpora.synthgrid.visemes`) drives the opening height and width, lip rounding/protrusion (a
narrower, rounder opening and fuller lips), teeth and tongue visibility and the lower lip tucked under the
upper teeth (f, v). An :class:`Appearance` fixes a speaker's look; a :class:`Nuisance` adds the per
utterance variation seen in real mouth ROIs (small head motion, scale, lighting, sensor noise).

The crop mimics AV-HuBERT's LRS3 preprocessing (a 96x96 crop centred on the mouth landmarks), so the mouth
stays near the centre and fills about half of the width.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

SIZE = 96


@dataclass(frozen=True)
class Appearance:
    """A speaker's mouth appearance; lengths in pixels of the 96x96 crop, intensities in [0, 1].

    Attributes:
        skin: skin gray level.  lip: lip gray level relative to the skin.  teeth: teeth gray level.
        mouth_width: half width of the mouth at rest.  max_open: opening height at ``open = 1``.
        upper_lip, lower_lip: lip thickness at the middle.  gain_open, gain_shape: articulation scale of
        the opening and of spread/protrusion (hypo- vs hyper-articulation).  coarticulation_s: the
        dominance decay time (seconds).  texture_seed: seed of the fixed skin texture.
    """

    skin: float = 0.62
    lip: float = 0.62
    teeth: float = 0.85
    mouth_width: float = 27.0
    max_open: float = 23.0
    upper_lip: float = 6.0
    lower_lip: float = 8.5
    gain_open: float = 1.0
    gain_shape: float = 1.0
    coarticulation_s: float = 0.035
    texture_seed: int = 0

    @staticmethod
    def sample(rng: np.random.Generator) -> Appearance:
        """Draw a random speaker appearance (ranges chosen so that every speaker looks plausible)."""
        return Appearance(
            skin=float(rng.uniform(0.42, 0.80)),
            lip=float(rng.uniform(0.50, 0.75)),
            teeth=float(rng.uniform(0.72, 0.95)),
            mouth_width=float(rng.uniform(23.0, 31.0)),
            max_open=float(rng.uniform(18.0, 28.0)),
            upper_lip=float(rng.uniform(4.5, 8.0)),
            lower_lip=float(rng.uniform(6.0, 11.0)),
            gain_open=float(rng.uniform(0.8, 1.2)),
            gain_shape=float(rng.uniform(0.75, 1.25)),
            coarticulation_s=float(rng.uniform(0.028, 0.045)),
            texture_seed=int(rng.integers(2**31)),
        )

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Nuisance:
    """Per-utterance nuisance of the recording; lengths in pixels, angles in degrees.

    Attributes:
        offset_x, offset_y: mouth centre offset from the crop centre.  motion: amplitude of the slow head
        motion (pixels; rotation ``motion`` degrees).  motion_hz: its frequency (Hz).  angle: head roll.
        scale: zoom factor.  light: overall gain.  light_x, light_y: horizontal/vertical lighting
        gradient over the crop.  noise: sensor noise standard deviation (gray levels of 255).
        phase: random phases of the motion (4 values).
    """

    offset_x: float = 0.0
    offset_y: float = 0.0
    motion: float = 0.0
    motion_hz: float = 0.4
    angle: float = 0.0
    scale: float = 1.0
    light: float = 1.0
    light_x: float = 0.0
    light_y: float = 0.0
    noise: float = 0.0
    phase: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @staticmethod
    def sample(rng: np.random.Generator, strength: float = 1.0) -> Nuisance:
        """Draw random nuisance; ``strength`` scales every deviation from the neutral value (0 = none)."""
        return Nuisance(
            offset_x=float(rng.uniform(-3, 3) * strength),
            offset_y=float(rng.uniform(-3, 3) * strength),
            motion=float(rng.uniform(0.3, 1.5) * strength),
            motion_hz=float(rng.uniform(0.2, 0.8)),
            angle=float(rng.uniform(-5, 5) * strength),
            scale=float(1.0 + rng.uniform(-0.1, 0.1) * strength),
            light=float(1.0 + rng.uniform(-0.25, 0.2) * strength),
            light_x=float(rng.uniform(-0.2, 0.2) * strength),
            light_y=float(rng.uniform(-0.15, 0.15) * strength),
            noise=float(rng.uniform(1.0, 4.0) * strength),
            phase=tuple(float(p) for p in rng.uniform(0, 2 * np.pi, size=4)),
        )


def _ramp(x: np.ndarray) -> np.ndarray:
    """Anti-aliased step: 0 below -0.5 px, 1 above 0.5 px, linear between (np.clip is slower)."""
    return np.minimum(np.maximum(x + np.float32(0.5), np.float32(0.0)), np.float32(1.0))


_MARGIN = 24  # texture canvas margin (pixels) for head motion


@functools.lru_cache(maxsize=128)
def _texture_canvas(seed: int, size: int) -> np.ndarray:
    """A speaker's fixed smooth skin texture (sum of random plane waves), centred on the mouth at rest.

    Returns float32 ``(S, S)`` with ``S = size + 2 * margin``, amplitude about 0.03 (relative to the skin).
    """
    rng = np.random.default_rng(seed)
    coords = np.arange(size + 2 * _MARGIN, dtype=np.float32) - (size + 2 * _MARGIN) / 2
    yy, xx = coords[:, None], coords[None, :]
    out = np.zeros((coords.shape[0], coords.shape[0]), dtype=np.float32)
    for _ in range(5):
        freq, theta, phase = rng.uniform(0.05, 0.35), rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi)
        out += np.cos(freq * (np.cos(theta) * xx + np.sin(theta) * yy) + phase).astype(np.float32)
    return np.float32(0.013) * out


@functools.lru_cache(maxsize=4)
def _noise_bank(size: int) -> np.ndarray:
    """A fixed bank of standard normal float32 samples; frames take random windows (cheaper than drawing)."""
    return np.random.default_rng(12345).standard_normal(size, dtype=np.float32)


def _texture(seed: int, cx: np.ndarray, cy: np.ndarray, size: int) -> np.ndarray:
    """The texture seen in each frame, moving with the mouth centre ``(cx, cy)`` (float ``(T, 1, 1)``).

    Returns float32 ``(T, size, size)`` (a gather from the speaker's canvas, to the nearest pixel).
    """
    canvas = _texture_canvas(seed, size)
    grid = np.arange(size)
    half = (size + 2 * _MARGIN) // 2
    ix = np.clip(
        np.rint(grid[None, None, :] - cx).astype(np.int64) + half, 0, canvas.shape[1] - 1
    )  # (T, 1, W)
    iy = np.clip(
        np.rint(grid[None, :, None] - cy).astype(np.int64) + half, 0, canvas.shape[0] - 1
    )  # (T, H, 1)
    return canvas[iy, ix]


def render_frames(
    params: np.ndarray,
    appearance: Appearance,
    nuisance: Nuisance,
    rng: np.random.Generator | None = None,
    fps: float = 25.0,
    size: int = SIZE,
) -> np.ndarray:
    """Draw the mouth for every frame of an articulator trajectory.

    Args:
        params: float ``(T, 6)`` trajectory in the order of ``visemes.PARAMS``.
        appearance: the speaker's look.
        nuisance: the utterance's head motion, scale, lighting and noise level.
        rng: generator for the sensor noise (required when ``nuisance.noise > 0``).
        fps: frame rate in frames per second (for the head-motion frequency).
        size: output height and width in pixels.

    Returns:
        uint8 ``(T, size, size)`` gray frames.

    Raises:
        ValueError: ``params`` is not ``(T, 6)`` with ``T >= 1``, or noise is asked for without ``rng``.
    """
    params = np.asarray(params, dtype=np.float32)
    if params.ndim != 2 or params.shape[1] != 6 or params.shape[0] < 1:
        raise ValueError(f"params must have shape (T, 6) with T >= 1, got {params.shape}")
    if nuisance.noise > 0 and rng is None:
        raise ValueError("sensor noise needs a random generator")
    num_frames = params.shape[0]

    def col(value: np.ndarray, low: float = -np.inf, high: float = np.inf) -> np.ndarray:
        return np.clip(np.asarray(value, dtype=np.float32), low, high).reshape(-1, 1, 1)  # (T,) -> (T, 1, 1)

    a = appearance
    t = np.arange(num_frames, dtype=np.float32) / fps
    w = 2 * np.pi * nuisance.motion_hz
    ph = nuisance.phase
    angle = np.deg2rad(nuisance.angle + nuisance.motion * np.sin(0.5 * w * t + ph[2]))
    scale = nuisance.scale * (1 + 0.02 * nuisance.motion * np.sin(0.3 * w * t + ph[3]))
    columns = {
        "opening": col(params[:, 0] * a.gain_open, 0.0, 1.2),
        "spread": col(params[:, 1] * a.gain_shape, -1.2, 1.2),
        "protrude": col(params[:, 2] * a.gain_shape, 0.0, 1.2),
        "teeth": col(params[:, 3], 0.0, 1.0),
        "tongue": col(params[:, 4], 0.0, 1.0),
        "tuck": col(params[:, 5], 0.0, 1.0),
        # head motion: mouth centre, roll and zoom
        "cx": col(size / 2 + nuisance.offset_x + nuisance.motion * np.sin(w * t + ph[0])),
        "cy": col(size / 2 + 4 + nuisance.offset_y + nuisance.motion * np.sin(0.7 * w * t + ph[1])),
        "cos": col(np.cos(angle) / scale),
        "sin": col(np.sin(angle) / scale),
    }
    grid = np.arange(size, dtype=np.float32)
    light = nuisance.light * (1 + nuisance.light_x * (grid[None, :] / size - 0.5))
    light = (255.0 * light * (1 + nuisance.light_y * (grid[:, None] / size - 0.5))).astype(
        np.float32
    )  # (H, W)
    if nuisance.noise > 0:
        bank = _noise_bank(1 << 22)
        offset = int(rng.integers(bank.shape[0] - num_frames * size * size))
        noise = bank[offset : offset + num_frames * size * size].reshape(num_frames, size, size)
    out = np.empty((num_frames, size, size), dtype=np.uint8)
    # chunks of frames keep the temporaries small (in cache, and below malloc's mmap threshold)
    for start in range(0, num_frames, _CHUNK):
        stop = min(start + _CHUNK, num_frames)
        image = _draw({k: v[start:stop] for k, v in columns.items()}, a, size) * light
        if nuisance.noise > 0:
            image += np.float32(nuisance.noise) * noise[start:stop]
        out[start:stop] = np.minimum(np.maximum(image, np.float32(0.0)), np.float32(255.0))
    return out


_CHUNK = 3  # frames drawn at once


def _draw(c: dict[str, np.ndarray], a: Appearance, size: int) -> np.ndarray:
    """Draw frames of the mouth, without lighting and noise.

    Args:
        c: per-frame columns float32 ``(t, 1, 1)``: opening, spread, protrude, teeth, tongue, tuck (the
            articulation, already scaled by the speaker's gains), cx, cy (mouth centre in pixels), cos, sin
            (roll, divided by the zoom).
        a: the speaker's appearance.
        size: image height and width.

    Returns:
        float32 ``(t, size, size)`` intensities in about [0, 1].
    """
    f32 = np.float32
    spread, protrude, tuck, teeth = c["spread"], c["protrude"], c["tuck"], c["teeth"]
    grid = np.arange(size, dtype=np.float32)
    gy, gx = grid.reshape(1, -1, 1) - c["cy"], grid.reshape(1, 1, -1) - c["cx"]
    xx = gx * c["cos"] + gy * c["sin"]  # (t, H, W), pixels, x to the right of the mouth centre
    yy = gy * c["cos"] - gx * c["sin"]  # (t, H, W), pixels, y downwards
    ax_ = np.abs(xx)

    # contours: inner opening (lens shaped, flatter when spread, rounder when protruded) and outer lip edges
    half_width = a.mouth_width * (1 + f32(0.12) * spread - f32(0.25) * protrude)  # mouth corners (t, 1, 1)
    inner_width = half_width * (f32(0.92) - f32(0.35) * protrude)
    height = a.max_open * c["opening"] * (1 - f32(0.3) * tuck)
    flat = f32(0.6) * np.maximum(spread, f32(0.0))
    u2 = np.minimum(ax_ / inner_width, f32(1.0)) ** 2
    prof_in = np.sqrt(1 - ((1 - flat) * u2 + flat * u2 * u2))  # (t, H, W)
    v2 = np.minimum(ax_ / half_width, f32(1.0)) ** 2
    prof_out = np.sqrt(1 - f32(0.5) * (v2 + v2 * v2))
    upper_in = f32(-0.35) * height * prof_in - f32(0.5) * tuck
    lower_in = (f32(0.65) * height - f32(2.0) * tuck) * prof_in
    bow = 1 - f32(0.25) * np.exp(-((xx * f32(0.25)) ** 2))  # cupid's bow
    upper_out = upper_in - (a.upper_lip * (1 + f32(0.5) * protrude)) * prof_out * bow
    lower_out = lower_in + (a.lower_lip * (1 + f32(0.4) * protrude - f32(0.5) * tuck)) * prof_out

    inside = _ramp(yy - upper_in) * _ramp(lower_in - yy) * _ramp(inner_width - ax_)
    lips = _ramp(yy - upper_out) * _ramp(lower_out - yy) * _ramp(half_width - ax_) * (1 - inside)
    closed = np.minimum(np.maximum(1 - height, f32(0.0)), f32(1.0))  # (t, 1, 1)
    seam = np.exp(-((yy - upper_in) ** 2)) * (closed * f32(0.5)) * _ramp(half_width - f32(2.0) - ax_)

    # inside the mouth: cavity, tongue from below, upper and lower teeth
    open_px = np.maximum(lower_in - upper_in, f32(0.0))
    tongue_top = lower_in - (f32(0.2) + f32(0.6) * c["tongue"]) * open_px
    tongue_mask = _ramp(yy - tongue_top) * _ramp(f32(0.6) * inner_width - ax_)
    upper_teeth = _ramp(upper_in + teeth * np.minimum(open_px, f32(5.0)) - yy)
    lower_teeth = _ramp(yy - (lower_in - f32(0.6) * teeth * np.minimum(open_px, f32(4.0))))
    teeth_mask = np.minimum(upper_teeth + lower_teeth, f32(1.0)) * _ramp(f32(0.8) * inner_width - ax_)
    teeth_tone = a.teeth * (1 - f32(0.3) * (1 - teeth))  # (t, 1, 1)
    mouth = f32(0.08) + f32(0.45 * a.skin - 0.08) * tongue_mask
    mouth = mouth + (teeth_tone - mouth) * teeth_mask * np.minimum(teeth * 2, f32(1.0))

    # lips darker than skin, with a highlight on the lower lip; upper lip a little darker
    highlight = np.exp(-(((yy - lower_out + f32(2.5)) * f32(0.4)) ** 2))
    lip_tone = f32(a.skin * a.lip) * (1 + f32(0.18) * highlight - f32(0.08) * _ramp(-yy))
    # skin: texture, nose shadow at the top, chin groove under the lower lip, around the mouth only
    around = np.exp(-((xx * f32(1.0 / (1.3 * a.mouth_width))) ** 2))
    nose = np.exp(-(((yy + f32(40.0)) * f32(0.125)) ** 2))
    chin = np.exp(-(((yy - lower_out - f32(6.0)) * f32(1 / 3.5)) ** 2))
    shade = around * (f32(0.2) * nose + f32(0.15) * chin)
    skin = f32(a.skin) * (1 + _texture(a.texture_seed, c["cx"], c["cy"], size) - shade)
    return (skin * (1 - lips - inside) + lip_tone * lips + mouth * inside) * (1 - seam)
