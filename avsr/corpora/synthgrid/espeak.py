"""Speech synthesis with eSpeak NG (Debian package ``espeak-ng``) through its C library, with phone timings.

eSpeak NG is a formant synthesiser (optionally a Klatt synthesiser); a voice is a language/accent (``en-us``,
``en-gb-scotland``, ...) and an optional *variant* (``+m3``, ``+f2``, ``+klatt4``, ...) that changes the
timbre: pitch base and range, formant frequencies and bandwidths, breathiness, roughness, echo. The library
(``libespeak-ng.so.1``, loaded with :mod:`ctypes`) synthesises in this process, synchronously: a callback
receives the samples (22050 Hz, 16 bit) together with events, among them one per word
(``espeakEVENT_WORD``) and, with ``espeakINITIALIZE_PHONEME_EVENTS``, one per phoneme
(``espeakEVENT_PHONEME``), each with the sample index where it starts in the output. With
``espeakINITIALIZE_PHONEME_IPA`` the phoneme events name the phoneme in IPA, the same notation for every
English accent; :func:`ipa_to_phones` maps it onto festival's US English phone set, which the viseme map of
:mod:`avsr.corpora.synthgrid.visemes` knows (a diphthong without a US counterpart, e.g. RP /iə/, becomes two
phones sharing its duration).

The library keeps state from one utterance to the next (the phase of its glottal source, its noise
generator): the same request said twice in one process gives different samples. Every utterance is therefore
synthesised in a child process forked for it (:func:`_speak_isolated`), in which the library is loaded and
initialised afresh, so that an utterance's audio depends on the request alone (about 10 ms of overhead).

The waveform is resampled to 16 kHz with the speaker's tape factor (as for festival voices), and 0.2 s of
silence (a ``pau`` segment) is added before and after the speech: eSpeak starts speaking within 15 ms and
stops within 10 ms of the end, where festival voices have about 0.2 s of pause, so the mouth starts and ends
at rest in every engine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pickle
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avsr.corpora.synthgrid.festival import SAMPLE_RATE, Synthesis, resample

#: where Debian installs espeak-ng's data (voices, variants, phoneme tables)
ESPEAK_DATA = Path("/usr/lib/x86_64-linux-gnu/espeak-ng-data")
#: silence added before and after the speech, in seconds
EDGE_PAUSE_S = 0.2
#: eSpeak NG's default speaking rate in words per minute (the rate factor 1.0)
DEFAULT_WPM = 175

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_INITIALIZE_PHONEME_IPA = 0x0002
_INITIALIZE_DONT_EXIT = 0x8000
_EVENT_LIST_TERMINATED, _EVENT_WORD, _EVENT_END, _EVENT_PHONEME = 0, 1, 5, 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH, _RANGE, _WORDGAP = 1, 3, 4, 7


class EspeakError(RuntimeError):
    """eSpeak NG is missing or failed, or a request is invalid (names the utterance)."""


class _Event(ctypes.Structure):
    """``espeak_EVENT`` of speak_lib.h (the ``id`` union read as its 8-byte string member)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


class _Library:
    """The initialised library of this process, and the output of the utterance being synthesised."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as exc:
            raise EspeakError(f"cannot load the eSpeak NG library ({exc}); install the Debian package "
                              "espeak-ng (bash scripts/install.sh)") from exc
        options = _INITIALIZE_PHONEME_EVENTS | _INITIALIZE_PHONEME_IPA | _INITIALIZE_DONT_EXIT
        self.rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, options)
        if self.rate <= 0:
            raise EspeakError(f"espeak_Initialize failed (returned {self.rate})")
        self.chunks: list[np.ndarray] = []
        self.events: list[tuple[int, int, str]] = []
        self._callback = _CALLBACK(self._receive)  # kept alive as long as the library
        self.lib.espeak_SetSynthCallback(self._callback)
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]

    def _receive(self, wav, num_samples, events) -> int:
        if num_samples > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            e = events[i]
            name = e.id.decode("utf-8", "replace") if e.type == _EVENT_PHONEME else ""
            self.events.append((e.type, e.sample, name))
            i += 1
        return 0

    def speak(self, voice: str, text: str, wpm: int, pitch: int, pitch_range: int):
        """Synthesise ``text``; returns ``(int16 samples, [(event type, sample, phoneme)])``."""
        self.chunks, self.events = [], []
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EspeakError(f"eSpeak NG has no voice {voice!r}")
        for parameter, value in ((_RATE, wpm), (_PITCH, pitch), (_RANGE, pitch_range), (_WORDGAP, 0)):
            self.lib.espeak_SetParameter(parameter, int(value), 0)
        data = text.encode() + b"\0"
        status = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self.lib.espeak_Synchronize()
        if status != 0:
            raise EspeakError(f"espeak_Synth failed with status {status}")
        wav = np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int16)
        return wav, self.events


def _speak_isolated(voice: str, text: str, wpm: int, pitch: int, pitch_range: int):
    """:meth:`_Library.speak` in a forked child with a freshly initialised library.

    Returns:
        ``(int16 samples, events, sample rate)``.

    Raises:
        EspeakError: the child failed (its error message) or died.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        status = 0
        try:
            os.close(read_fd)
            try:
                lib = _Library()
                wav, events = lib.speak(voice, text, wpm, pitch, pitch_range)
                payload = pickle.dumps(("ok", wav.tobytes(), events, lib.rate))
            except Exception as exc:  # reported to the parent
                payload = pickle.dumps(("error", str(exc), None, None))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data or status != 0:
        raise EspeakError(f"the eSpeak NG child process failed (wait status {status})")
    kind, wav, events, rate = pickle.loads(data)
    if kind != "ok":
        raise EspeakError(wav)
    return np.frombuffer(wav, dtype=np.int16), events, rate


def espeak_available() -> bool:
    """Whether the eSpeak NG library and its data are installed."""
    return (ctypes.util.find_library("espeak-ng") is not None or Path("/usr/lib/x86_64-linux-gnu/"
            "libespeak-ng.so.1").exists()) and ESPEAK_DATA.is_dir()


def installed_variants(root: Path = ESPEAK_DATA) -> list[str]:
    """The variant files of the installed espeak-ng (``voices/!v/*``), sorted."""
    return sorted(p.name for p in (root / "voices" / "!v").glob("*") if p.is_file())


# --- IPA -> festival's US English phones -----------------------------------------------------------------
_CONSONANTS = {
    "p": "p", "b": "b", "t": "t", "d": "d", "k": "k", "ɡ": "g", "g": "g", "m": "m", "n": "n", "ŋ": "ng",
    "f": "f", "v": "v", "θ": "th", "ð": "dh", "s": "s", "z": "z", "ʃ": "sh", "ʒ": "zh", "tʃ": "ch",
    "dʒ": "jh", "h": "hh", "ɹ": "r", "r": "r", "ɾ": "d", "ɻ": "r", "l": "l", "ɫ": "l", "w": "w", "ʍ": "w",
    "j": "y", "ʔ": "hh", "x": "hh", "ç": "hh",
}  # fmt: skip
#: single vowels; ``e`` and ``o`` are the long monophthongs of FACE and GOAT in northern and Scottish accents
_VOWELS = {
    "i": "iy", "ɪ": "ih", "e": "ey", "ɛ": "eh", "æ": "ae", "a": "ae", "ɐ": "ax", "ɑ": "aa", "ɒ": "aa",
    "ɔ": "ao", "o": "ow", "ʊ": "uh", "u": "uw", "ʉ": "uw", "ʌ": "ah", "ə": "ax", "ɜ": "er", "ɚ": "er",
    "ɝ": "er", "ɵ": "ax", "ɘ": "ax", "ɨ": "ih", "ᵻ": "ih", "y": "uw", "ø": "uh", "œ": "eh", "ɯ": "uw",
    "ɤ": "ah", "ɞ": "er",
}  # fmt: skip
#: vowel pairs with a US English diphthong (others become two vowels)
_DIPHTHONGS = {
    "eɪ": "ey", "ei": "ey", "ɛɪ": "ey", "aɪ": "ay", "ɑɪ": "ay", "ʌɪ": "ay", "ɐɪ": "ay", "ɔɪ": "oy",
    "oɪ": "oy", "aʊ": "aw", "æʊ": "aw", "ɐʊ": "aw", "ɑʊ": "aw", "au": "aw", "ʌʉ": "aw", "oʊ": "ow",
    "əʊ": "ow", "ɔʊ": "ow", "ou": "ow", "ʌʊ": "ow", "ɜʊ": "ow",
}  # fmt: skip
#: length marks, tie bars, and diacritics that do not change the viseme
_DROP = {"ː", "ˑ", "ˈ", "ˌ", "ʰ", "ʲ", "ʷ", "ˠ", "-"}


def ipa_to_phones(ipa: str) -> list[str]:
    """The festival phones of one eSpeak NG phoneme in IPA (empty string or ``_``: a pause).

    Returns:
        one phone, or two for a diphthong without a US English counterpart (``iə`` -> ``iy ax``) or a
        vowel with its r (``ɑːɹ`` -> ``aa r``); ``["pau"]`` for a pause.

    Raises:
        EspeakError: a symbol without a mapping (names it).
    """
    chars = [c for c in unicodedata.normalize("NFD", ipa) if c not in _DROP and not unicodedata.combining(c)]
    text = "".join(chars)
    if not text or set(text) <= {"_", " "}:
        return ["pau"]
    if text in _CONSONANTS:
        return [_CONSONANTS[text]]
    tail = []
    if len(text) > 1 and text[-1] in "ɹr":
        text, tail = text[:-1], [_CONSONANTS[text[-1]]]
    if text in _DIPHTHONGS:
        return [_DIPHTHONGS[text], *tail]
    if all(c in _VOWELS for c in text):
        return [_VOWELS[c] for c in text] + tail
    if len(text) == 2 and all(c in _CONSONANTS for c in text):  # an affricate-like cluster written as one
        return [_CONSONANTS[c] for c in text] + tail
    raise EspeakError(f"eSpeak NG phoneme {ipa!r} has no festival phone")


@dataclass(frozen=True)
class EspeakVoice:
    """A voice to speak with: accent, variant and prosody in eSpeak NG's units.

    Attributes:
        accent: an English voice of eSpeak NG (``en-us``, ``en-gb-scotland``, ...).
        variant: a file of ``voices/!v`` (``m3``, ``klatt4``, ``Annie``; None: the accent's own voice).
        wpm: speaking rate in words per minute (80-450; eSpeak's default 175).
        pitch: base pitch 0-99 within the variant's pitch range (50: the variant's own).
        pitch_range: intonation range 0-99 (50: the default, 0: monotone).
    """

    accent: str
    variant: str | None = None
    wpm: int = DEFAULT_WPM
    pitch: int = 50
    pitch_range: int = 50

    @property
    def name(self) -> str:
        """The name ``espeak_SetVoiceByName`` takes: ``accent[+variant]``."""
        return self.accent + (f"+{self.variant}" if self.variant else "")


def _check(voice: EspeakVoice, name: str) -> None:
    if voice.variant is not None and not (ESPEAK_DATA / "voices" / "!v" / voice.variant).is_file():
        # espeak_SetVoiceByName ignores an unknown variant silently: check it here
        raise EspeakError(f"utterance {name}: eSpeak NG has no variant {voice.variant!r} "
                          f"(known: {installed_variants()})")
    if not (80 <= voice.wpm <= 450 and 0 <= voice.pitch <= 99 and 0 <= voice.pitch_range <= 99):
        raise EspeakError(f"utterance {name}: rate {voice.wpm} wpm, pitch {voice.pitch} or range "
                          f"{voice.pitch_range} out of eSpeak NG's range")


def segments_from_events(
    events: list[tuple[int, int, str]], num_samples: int, rate: int
) -> tuple[list[tuple[float, float, str]], list[tuple[float, float]]]:
    """Phone segments and word spans from eSpeak NG's events.

    Each phoneme lasts from its event to the next phoneme's (or the end of the audio); consecutive pauses
    merge, a two-phone phoneme splits its duration in halves, and a pause covers the audio before the first
    phoneme. A word spans its non-pause phonemes (words whose events carry no phoneme are left out).

    Args:
        events: ``(type, sample, ipa)`` in the order eSpeak reported them.
        num_samples: length of the audio.  rate: its sample rate.

    Returns:
        ``(segments [(start_s, end_s, phone)] contiguous from 0 to the end of the audio,
        words [(start_s, end_s)])``.
    """
    phonemes = [(s, p) for t, s, p in events if t == _EVENT_PHONEME]
    bounds = [s for s, _ in phonemes] + [num_samples]
    segments: list[tuple[float, float, str]] = []

    def add(start: float, end: float, phone: str) -> None:
        if end <= start:
            return
        if segments and phone == "pau" and segments[-1][2] == "pau":
            segments[-1] = (segments[-1][0], end, "pau")
        else:
            segments.append((start, end, phone))

    add(0.0, (bounds[0] if phonemes else num_samples) / rate, "pau")
    for i, (sample, ipa) in enumerate(phonemes):
        start, end = sample / rate, max(bounds[i + 1], sample) / rate
        phones = ipa_to_phones(ipa)
        step = (end - start) / len(phones)
        for k, phone in enumerate(phones):
            add(start + k * step, start + (k + 1) * step, phone)
    if segments[-1][1] < num_samples / rate:
        add(segments[-1][1], num_samples / rate, "pau")

    # words: the phonemes reported after a word's event and before the next word's, pauses left out
    spans: list[tuple[float, float]] = []
    word: list[tuple[float, float]] | None = None
    k = 0
    for kind, sample, ipa in events:
        if kind == _EVENT_WORD:
            if word:
                spans.append((word[0][0], word[-1][1]))
            word = []
        elif kind == _EVENT_PHONEME:
            if word is not None and ipa_to_phones(ipa) != ["pau"]:
                word.append((sample / rate, max(bounds[k + 1], sample) / rate))
            k += 1
    if word:
        spans.append((word[0][0], word[-1][1]))
    return segments, spans


def synthesize(name: str, text: str, voice: EspeakVoice, tape: float = 1.0) -> Synthesis:
    """Synthesise one utterance.

    Args:
        name: utterance id (for messages).  text: what to say (see ``engines.engine_text``).
        voice: accent, variant and prosody.  tape: tape-speed factor of the resampling to 16 kHz (pitch
            and formants x tape, durations / tape).

    Returns:
        16 kHz audio with phone segments and word spans (seconds), :data:`EDGE_PAUSE_S` of silence added
        at both ends.

    Raises:
        EspeakError: library missing, unknown voice or variant, parameters out of range, no audio, or a
            phoneme without a festival phone.
    """
    _check(voice, name)
    try:
        wav, events, rate = _speak_isolated(voice.name, text, voice.wpm, voice.pitch, voice.pitch_range)
        if wav.shape[0] == 0:
            raise EspeakError("no audio")
        segments, words = segments_from_events(events, wav.shape[0], rate)
    except EspeakError as exc:
        raise EspeakError(f"utterance {name} (voice {voice.name}, text {text!r}): {exc}") from exc
    pad = int(round(EDGE_PAUSE_S * SAMPLE_RATE))
    num_samples = int(round(wav.shape[0] * SAMPLE_RATE / (rate * tape)))
    speech = resample(wav.astype(np.float32) / 32768.0, num_samples)
    audio = np.concatenate([np.zeros(pad, np.float32), speech, np.zeros(pad, np.float32)])
    shift = pad / SAMPLE_RATE
    segments = [(s / tape + shift, e / tape + shift, p) for s, e, p in segments]
    segments = [(0.0, shift, "pau"), *segments, (segments[-1][1], audio.shape[0] / SAMPLE_RATE, "pau")]
    merged: list[tuple[float, float, str]] = []
    for s, e, p in segments:
        if merged and p == "pau" and merged[-1][2] == "pau":
            merged[-1] = (merged[-1][0], e, p)
        elif e > s:
            merged.append((s, e, p))
    return Synthesis(audio, merged, [(s / tape + shift, e / tape + shift) for s, e in words])
