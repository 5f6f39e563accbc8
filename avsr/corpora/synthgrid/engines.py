"""The speech synthesisers of SynthGRID besides festival: eSpeak NG and flite, their voices, and one request
type for both.

Engines (:data:`ENGINES`): ``festival`` (:mod:`.festival`, voices in :mod:`.voices`), ``espeak-ng``
(:mod:`.espeak`: an English accent times a voice variant, with rate, pitch and pitch range) and ``flite``
(:mod:`.flite`: five built-in voices). All three come from Debian main; every one gives phone timings in
festival's US English phone set, which drive the mouth video. A voice of another engine than festival is
named by a *voice key*: ``espeak-ng:<accent>[+<variant>]`` or ``flite:<voice>`` (:func:`voice_key`,
:func:`parse_voice_key`); festival voices keep their names.

The catalogue (:data:`ESPEAK_ACCENTS`, :data:`ESPEAK_VARIANTS`, :data:`FLITE_VOICES`) says in one sentence how
each voice sounds, read from its parameters (an eSpeak variant file's pitch line in Hz, formant shifts,
voicing, breath, flutter, echo and Klatt mode; the accents' phones of the GRID words);
:func:`catalogue_markdown` writes it, with festival's voices, as the table of
``recipes/synthgrid/avsr1/local/VOICES.md``. The held-out voices (:data:`ESPEAK_UNSEEN_VARIANTS`,
:data:`FLITE_UNSEEN_VOICES`) speak no training utterance: they are the speakers of the per-engine test sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avsr.corpora.synthgrid import espeak, flite
from avsr.corpora.synthgrid.festival import FestivalError, Synthesis
from avsr.corpora.synthgrid.grammar import festival_text

#: the synthesisers, in the order of the seeding (new ones are appended)
ENGINES = ("festival", "espeak-ng", "flite")

#: how each engine is told to say the GRID letters whose capital it misreads (both read a lone "A" as the
#: article /ax/); the rest of the sentence is ``grammar.festival_text``
LETTER_TEXT = {"espeak-ng": {"A": "eigh"}, "flite": {"A": "ay"}}

#: eSpeak NG's English voices (``espeak-ng --voices=en`` without the MBROLA ones): accent -> description.
#: The key is the voice file's name, which ``espeak_SetVoiceByName`` takes.
ESPEAK_ACCENTS: dict[str, str] = {
    "en": "Southern British English (espeak-ng's en-gb): non-rhotic, /ɑː/ in R, 'zee' for Z, a clear "
          "standard accent.",
    "en-us": "General American: rhotic r (R as one /ɑːɹ/ unit), /oʊ/ in ZERO, flat American intonation.",
    "en-gb-scotland": "Scottish English: rolled r, monophthongs /eː/ (LAY, EIGHT) and /oː/ (ZERO), fronted "
                      "/ʉː/ in BLUE and TWO, /ʌʉ/ in NOW, 'zed' for Z.",
    "en-gb-x-gbclan": "Lancashire (north-west England): monophthongs /eː/ and /oː/, short /a/ in AT, /ɒ/ in "
                      "ONE, 'zed'.",
    "en-gb-x-rp": "Received Pronunciation: conservative southern British, /əʊ/ in ZERO and O, /ɒ/ in ONE, "
                  "non-rhotic, 'zed'.",
    "en-gb-x-gbcwmd": "West Midlands (Birmingham): broad diphthongs, /ɔɪ/ in FIVE, NINE, BY, WHITE, /əu/ in "
                      "BLUE, TWO, SOON, /ei/ in GREEN and the E-letters, /ʊ/ in ONE.",
    "en-029": "Caribbean English: stopped th (WITH as 'wid', THREE with dental t), open /a/ in AGAIN and AT, "
              "/ɑə/ in R, 'zed'.",
    "en-us-nyc": "New York City American: in the GRID words its phones are General American's, with its own "
                 "vowel qualities and rhythm.",
}  # fmt: skip

#: eSpeak NG's voice variants (``voices/!v``, ``espeak-ng --voices=variant``) -> description; None is the
#: accent's own voice. The pitch in Hz is the range of the variant file's ``pitch`` line.
ESPEAK_VARIANTS: dict[str | None, str] = {
    None: "the accent's own voice: espeak-ng's default male formant voice (82-118 Hz), clear and buzzy.",
    "Alex": "male, nearly monotone (105-115 Hz), softened voicing: flat and calm.",
    "Alicia": "female, high and wide (180-275 Hz), strongly raised formants and a light echo: bright, small.",
    "Andrea": "female, high (200-265 Hz), raised formants and flat intonation: thin and level.",
    "Andy": "male, low (85-110 Hz), upper formants removed: dull and muffled.",
    "Annie": "female with a very wide pitch range (120-280 Hz) and raised formants: lively, sing-song.",
    "AnxiousAndy": "male, almost monotone (~110 Hz), every syllable lengthened and loud: tense and halting.",
    "Demonic": "very low (43-120 Hz), lowered formants, heavy breath, flutter and echo: a growling monster.",
    "Denis": "male (80-115 Hz), weak voicing and removed upper formants: soft, breathy, muffled.",
    "Diogo": "male (82-122 Hz), strong low formants and a cut F4: full and boomy.",
    "Gene": "male (80-110 Hz), strong voicing, weak consonants: smooth, bassy, slightly slurred.",
    "Gene2": "Gene at a higher pitch (100-130 Hz): smooth, slurred, lighter.",
    "Henrique": "male with a wide low pitch (70-130 Hz), strong low formants: boomy and expressive.",
    "Hugo": "the same settings as Henrique (70-130 Hz): boomy and expressive.",
    "Jacky": "male (85-130 Hz), F3-F5 nearly removed: hollow and nasal, like a small loudspeaker.",
    "Lee": "male (85-110 Hz), F3 removed and F4 boosted: metallic and whistly.",
    "Marco": "male (100-152 Hz), low wide F1, echo and flutter: lively, a little reverberant.",
    "Mario": "male (75-125 Hz), strong voicing, damped upper formants: deep and dark.",
    "Michael": "male (75-125 Hz), lowered F1 and F3, strong voicing: deep, dark and round.",
    "Mike": "male, low (67-107 Hz), softened voicing: a deeper, slightly breathy default voice.",
    "Mr serious": "male (82-118 Hz), bass-heavy tone, lowered F3: grave, announcer-like.",
    "Nguyen": "male, wide higher pitch (95-175 Hz), damped upper formants, shaped spectrum: soft.",
    "RicishayMax": "default pitch, damped upper formants and a very long echo: a robot in a large hall.",
    "RicishayMax2": "RicishayMax with a rough, strongly voiced source and a shorter echo: harsh robot.",
    "RicishayMax3": "RicishayMax2 with a longer echo delay: harsh robot, more distant.",
    "Storm": "male, damped upper formants, flat intonation: calm, dull, low energy.",
    "Tweaky": "male (82-118 Hz) with F3 doubled: squeaky, distorted vowels.",
    "UniRobot": "male Klatt voice (100-160 Hz), shifted formants and a long echo: a synthetic 'universal "
                "robot'.",
    "adam": "Klatt synthesiser (mode 6), softer consonants, wider F1: smooth male.",
    "anika": "female, high (200-300 Hz), strong flutter: bright, wavering young voice.",
    "anikaRobot": "anika with little flutter and a long echo: a robotic female.",
    "announcer": "very low Klatt voice (37-83 Hz), soft consonants and echo: a deep public-address "
                 "announcer.",
    "antonio": "male (82-128 Hz), strong voicing, no formants above F5: warm with muffled treble.",
    "aunty": "female, narrow high pitch (176-204 Hz), strong flutter, raised formants: an older woman, "
             "wavering.",
    "belinda": "female (200-247 Hz), high F1-F2 with narrow bandwidths: bright and light.",
    "benjamin": "Klatt synthesiser (mode 6), softer consonants: smooth male.",
    "boris": "male, low formant F0 and F3 strongly lowered: hollow, dark timbre.",
    "caleb": "Klatt whisper: no voicing, only breath noise.",
    "croak": "elderly male (85-117 Hz) with very strong pitch flutter: croaky and shaky.",
    "david": "Klatt synthesiser, very low (62-89 Hz), lowered formants: deep bass male.",
    "ed": "male (90-145 Hz), reshaped upper formants and soft consonants: nasal and warbly.",
    "edward": "Klatt synthesiser (mode 5), lowered F1, raised F2-F4: clear, slightly nasal male.",
    "edward2": "edward with Klatt mode 6: clear, slightly nasal male, smoother source.",
    "f1": "female (140-200 Hz), flutter and roughness: an older, husky woman.",
    "f2": "female (142-220 Hz), slight roughness, breath and echo: soft and breathy.",
    "f3": "female (140-240 Hz), strongly raised F2: bright and clear.",
    "f4": "female (142-200 Hz), raised formants and an echo: clear, a little distant.",
    "f5": "female (160-228 Hz), raised formants, smooth source: clear young female.",
    "fast": "the default voice with espeak-ng's experimental fast-speech setting: hurried, clipped.",
    "grandma": "elderly female (120-230 Hz), strong flutter, weak voicing, damped highs: thin and shaky.",
    "grandpa": "elderly male (80-120 Hz), strong flutter, damped highs: shaky and old.",
    "gustave": "male (80-123 Hz), lowered F1 and F3, strong voicing: deep and dark.",
    "iven": "male (74-118 Hz), very strong voicing, lowered low formant: buzzy and heavy.",
    "iven2": "iven with weak consonants and less voicing: heavy and mumbling.",
    "iven3": "iven with moderate voicing: heavy, less buzzy.",
    "iven4": "iven3 with the treble cut: heavy and dull.",
    "john": "male (82-118 Hz), bass-heavy tone: a full, plain male voice.",
    "kaukovalta": "male (70-120 Hz), F1 strongly lowered: hollow and distant.",
    "klatt": "Klatt synthesiser (mode 1), the accent's settings: smoother, less buzzy than the default.",
    "klatt2": "Klatt synthesiser, glottal source mode 2: smoother than the formant voice, default pitch.",
    "klatt3": "Klatt synthesiser, glottal source mode 3: smoother than the formant voice, default pitch.",
    "klatt4": "Klatt synthesiser, glottal source mode 4: smoother than the formant voice, default pitch.",
    "klatt5": "Klatt synthesiser, glottal source mode 5: smoother than the formant voice, default pitch.",
    "klatt6": "Klatt synthesiser, glottal source mode 6: smoother than the formant voice, default pitch.",
    "linda": "female (200-247 Hz), light flutter, raised F1-F3: bright and light.",
    "m1": "male (75-109 Hz), flutter and roughness: an older, rough male.",
    "m2": "male (88-115 Hz), lowered F1, raised F2 and an echo: hollow, in a room.",
    "m3": "male (80-122 Hz), slightly lowered formants: a plain male, a little deeper than the default.",
    "m4": "male, low (70-110 Hz), slightly raised formants: deep but bright.",
    "m5": "male, lowered and widened F2: muffled, rounder vowels.",
    "m6": "male (82-117 Hz), wide formant bandwidths: soft and muted.",
    "m7": "male (75-125 Hz), stronger voicing and damped upper formants: warm and dark.",
    "m8": "male, low (65-102 Hz), damped highs and a shaped tone: deep and muffled.",
    "marcelo": "male (65-115 Hz), strongly lowered formants: deep, dark and boomy.",
    "max": "default pitch, upper formants removed: dull and robot-like.",
    "michel": "male (82-122 Hz), strong low formants and a cut F4: full and boomy.",
    "miguel": "male (80-130 Hz), strong low formants and a cut F4: full, boomy and a little livelier.",
    "norbert": "male (82-118 Hz), F2 strongly lowered, shaped tone: muffled, rounded vowels.",
    "pablo": "male (82-130 Hz), raised F4-F5, light echo: bright and roomy.",
    "paul": "male, low (70-100 Hz), very strong voicing, cut F4: buzzy and deep.",
    "pedro": "male (82-118 Hz), strong low formant, lengthened stressed syllables: slow and emphatic.",
    "quincy": "male, low (67-100 Hz), damped upper formants, soft consonants: deep and mellow.",
    "rob": "male with a very wide low pitch (50-130 Hz), no F7-F8: gravelly and expressive.",
    "robert": "male (65-115 Hz), damped upper formants: deep and dark.",
    "robosoft": "Klatt synthesiser, low monotone (60-90 Hz), very rough, echo: a harsh robot.",
    "robosoft2": "Klatt synthesiser (90-130 Hz), rough, inverted intonation: a robot.",
    "robosoft3": "Klatt synthesiser (75-115 Hz), long echo: a robot in a hall.",
    "robosoft4": "formant voice (75-115 Hz), slight roughness, strong voicing, long echo: robotic and "
                 "reverberant.",
    "robosoft5": "robosoft4 without roughness: smooth robotic and reverberant.",
    "robosoft6": "monotone 150 Hz, long echo, shaped spectrum: a flat electronic voice.",
    "robosoft7": "formant voice (75-115 Hz), upper formants removed, long echo: dull and reverberant.",
    "robosoft8": "monotone 150 Hz with upper formants removed and an echo: flat and dull.",
    "sandro": "male (78-115 Hz), strong consonants and voicing, breath: crisp and emphatic.",
    "shelby": "high (100-210 Hz), raised F2-F3, weak voicing: bright and breathy.",
    "steph": "female (166-200 Hz), F4 removed and shaped tone: soft and muffled.",
    "steph2": "steph with stronger formants: soft, clearer.",
    "steph3": "steph with strong voicing: soft and buzzier.",
    "travis": "male (75-120 Hz), F1 halved and F4 lowered: hollow and boxy.",
    "victor": "male (80-110 Hz), weak voicing, light breath, damped highs: soft and breathy.",
    "whisper": "male whisper: almost no voicing, breath noise and flutter.",
    "whisperf": "female whisper: almost no voicing, breath noise, raised formants.",
    "zac": "a child: very high (240-390 Hz) with every formant raised by 45%.",
}  # fmt: skip

#: flite's voices -> description (sample rate in brackets)
FLITE_VOICES: dict[str, str] = {
    "kal": "US male diphone voice (8 kHz, upsampled to 16 kHz): the kal diphones of festival's kal_diphone "
           "in flite's engine, telephone-band and buzzy.",
    "kal16": "the same US male diphones at 16 kHz: clear, slightly robotic, choppy joins.",
    "awb": "Scottish English male clustergen (statistical parametric) voice (16 kHz): smooth, vocoded, "
           "a little muffled.",
    "rms": "US male clustergen voice (16 kHz): deep, smooth and vocoded; keeps its own pitch (ignores the "
           "pitch targets).",
    "slt": "US female clustergen voice (16 kHz): clear and smooth, vocoded, fairly high pitch (~180 Hz).",
}  # fmt: skip

#: the heard pitch range (Hz) drawn for a flite speaker (None: the voice keeps its own pitch)
FLITE_F0_RANGE: dict[str, tuple[float, float] | None] = {
    "kal": (85.0, 140.0), "kal16": (85.0, 140.0), "awb": (90.0, 145.0), "rms": None, "slt": (150.0, 230.0),
}  # fmt: skip

#: eSpeak NG variants that speak no training utterance (the speakers of test_espeak_ng), chosen across the
#: families: plain male and female, Klatt, elderly, deep, bright, child-like pitch ranges
ESPEAK_UNSEEN_VARIANTS = ("Alicia", "Annie", "Gene2", "edward2", "f5", "grandma", "iven3", "klatt3", "m7",
                          "robert", "steph2", "travis")
#: flite voices that speak no training utterance (the speakers of test_flite)
FLITE_UNSEEN_VOICES = ("rms",)


class EngineError(FestivalError):
    """eSpeak NG or flite is missing or failed (a :class:`FestivalError`, so that callers and the command
    line treat every synthesiser's failure alike)."""


def voice_key(engine: str, voice: str, variant: str | None = None) -> str:
    """The key of a voice: festival's voice name, ``espeak-ng:<accent>[+<variant>]`` or ``flite:<voice>``."""
    if engine == "festival":
        return voice
    return f"{engine}:{voice}" + (f"+{variant}" if variant else "")


def parse_voice_key(key: str) -> tuple[str, str, str | None]:
    """``(engine, voice, variant)`` of a voice key (a key without ``:`` is a festival voice).

    Raises:
        ValueError: an unknown engine, accent, variant or flite voice (names it).
    """
    if ":" not in key:
        return "festival", key, None
    engine, rest = key.split(":", 1)
    voice, _, variant = rest.partition("+")
    if engine == "espeak-ng":
        if voice not in ESPEAK_ACCENTS or (variant or None) not in ESPEAK_VARIANTS:
            raise ValueError(f"unknown eSpeak NG voice {rest!r}: accents {list(ESPEAK_ACCENTS)}, variants "
                             f"{sorted(v for v in ESPEAK_VARIANTS if v)}")
        return engine, voice, variant or None
    if engine == "flite":
        if voice not in FLITE_VOICES or variant:
            raise ValueError(f"unknown flite voice {rest!r}; known: {list(FLITE_VOICES)}")
        return engine, voice, None
    raise ValueError(f"unknown engine {engine!r} in voice key {key!r}; known: {list(ENGINES)}")


def _interleave(accents: list[str], variants: list[str | None]) -> tuple[str, ...]:
    """Accent ``k mod A`` with variant ``k mod V`` for k < lcm(A, V): every pair once, neighbours differ in
    both."""
    from math import lcm

    return tuple(voice_key("espeak-ng", accents[k % len(accents)], variants[k % len(variants)])
                 for k in range(lcm(len(accents), len(variants))))


def engine_voices(engine: str, unseen: bool = False) -> tuple[str, ...]:
    """The voice keys of an engine other than festival: its training voices, or (``unseen``) its held-out
    voices, in the order speakers cycle through them.

    Raises:
        ValueError: festival or an unknown engine.
    """
    if engine == "espeak-ng":
        variants = [v for v in ESPEAK_VARIANTS if (v in ESPEAK_UNSEEN_VARIANTS) == unseen]
        # a fixed shuffle of the variants (the catalogue is alphabetical): a few speakers get a mix of them
        order = np.random.default_rng(2026).permutation(len(variants))
        return _interleave(list(ESPEAK_ACCENTS), [variants[i] for i in order])
    if engine == "flite":
        return tuple(voice_key("flite", v) for v in FLITE_VOICES if (v in FLITE_UNSEEN_VOICES) == unseen)
    raise ValueError(f"engine_voices: {engine!r} is not one of {list(ENGINES[1:])}")


def engine_available(engine: str) -> bool:
    """Whether an engine is installed here."""
    from avsr.corpora.synthgrid.festival import festival_available

    return {"festival": festival_available, "espeak-ng": espeak.espeak_available,
            "flite": flite.flite_available}[engine]()


def engine_text(engine: str, words: tuple[str, ...]) -> str:
    """The text an engine is given for a GRID sentence (:data:`LETTER_TEXT` for the letters it misreads)."""
    fixes = LETTER_TEXT.get(engine, {})
    text = festival_text(words).split()
    return " ".join(fixes.get(w, t) if i == 3 else t for i, (w, t) in enumerate(zip(words, text)))


@dataclass(frozen=True)
class EngineRequest:
    """One utterance for eSpeak NG or flite.

    Attributes:
        name: utterance id.  words: the GRID sentence.  engine: ``espeak-ng`` or ``flite``.
        voice: eSpeak accent or flite voice.  variant: eSpeak variant (None: the accent's own).
        rate: speaking-rate factor (> 1 faster; eSpeak: ``175 * rate`` words per minute; flite:
            ``duration_stretch = 1 / rate``).
        pitch, pitch_range: eSpeak's pitch and range parameters (0-99; None: 50).
        f0_mean, f0_std: flite's pitch target mean and standard deviation in Hz (None: the voice's own).
        tape: tape-speed factor of the resampling (pitch and formants x tape, durations / tape).
    """

    name: str
    words: tuple[str, ...]
    engine: str
    voice: str
    variant: str | None = None
    rate: float = 1.0
    pitch: int | None = None
    pitch_range: int | None = None
    f0_mean: float | None = None
    f0_std: float | None = None
    tape: float = 1.0


def synthesize_one(request: EngineRequest) -> Synthesis:
    """Synthesise one request with its engine (16 kHz audio, festival phone segments, word spans).

    Raises:
        EngineError: unknown engine, or the engine failed (the message names the utterance).
    """
    text = engine_text(request.engine, request.words)
    if not 0.5 <= request.tape <= 2.0:
        raise EngineError(f"utterance {request.name}: tape {request.tape} out of range")
    try:
        if request.engine == "espeak-ng":
            wpm = int(round(espeak.DEFAULT_WPM * request.rate))
            v = espeak.EspeakVoice(request.voice, request.variant, wpm,
                                   50 if request.pitch is None else request.pitch,
                                   50 if request.pitch_range is None else request.pitch_range)
            return espeak.synthesize(request.name, text, v, request.tape)
        if request.engine == "flite":
            v = flite.FliteVoice(request.voice, request.rate, request.f0_mean, request.f0_std)
            return flite.synthesize(request.name, text, v, request.tape, request.words)
    except (espeak.EspeakError, flite.FliteError) as exc:
        raise EngineError(str(exc)) from exc
    raise EngineError(f"utterance {request.name}: engine {request.engine!r} is not one of "
                      f"{list(ENGINES[1:])} (festival voices go through avsr.corpora.synthgrid.festival)")


def synthesize(requests: list[EngineRequest]) -> list[Synthesis]:
    """Synthesise a batch (one after the other, in this process or one flite process each)."""
    return [synthesize_one(r) for r in requests]


def catalogue_markdown() -> str:
    """Every voice of every engine with one sentence on how it sounds, as a markdown document."""
    from avsr.corpora.synthgrid.voices import UNSEEN_VOICES, VOICES

    held = " (held out: test_unseen_voice)"
    lines = [
        "# SynthGRID voices",
        "",
        "Generated by `python -m avsr.bin.synthgrid --list-voices` from "
        "`avsr/corpora/synthgrid/engines.py` and `voices.py`; every engine is in Debian main (festival, "
        "espeak-ng, flite). A voice marked held out "
        "speaks no training utterance: it is a speaker of the test set named.",
        "",
        "Timings: eSpeak NG reports where each phoneme starts in its output (phoneme events of its "
        "library), flite prints the end of each phone segment it synthesised (`-psdur`); both are mapped "
        "onto festival's phone set for the mouth video. Against the energy edges of words said with a pause "
        "between them (`local/engine_timing.py`, 5 sentences x 24 eSpeak voices and x 5 flite voices), word "
        "starts are off by a median 3 ms (eSpeak NG) and 4 ms (flite), 90th percentile 8 ms and 53 ms (flite "
        "counts a stop's silent closure in the word), word ends by a median 5 ms and 10 ms, 90th percentile "
        "35 ms and 25 ms.",
        "",
        f"## festival ({len(VOICES)} voices)",
        "",
        "| voice | Debian package | how it sounds |",
        "|---|---|---|",
        *(f"| `{v.name}` | {v.package} | {v.description}{held if v.name in UNSEEN_VOICES else ''} |"
          for v in VOICES.values()),
        "",
        f"## espeak-ng: {len(ESPEAK_ACCENTS)} English accents x {len(ESPEAK_VARIANTS)} variants",
        "",
        "A speaker is an accent with a variant (`espeak-ng:en-gb-scotland+m3`), a rate (140-220 words per "
        "minute), a pitch and a pitch range (eSpeak's 0-99 parameters, drawn 25-75 and 20-80).",
        "",
        "| accent | how it sounds |",
        "|---|---|",
        *(f"| `{a}` | {d} |" for a, d in ESPEAK_ACCENTS.items()),
        "",
        "| variant | how it sounds |",
        "|---|---|",
        *(f"| `{'+' + v if v else '(none)'}` | {d[0].upper() + d[1:]}"
          f"{' (held out: test_espeak_ng)' if v in ESPEAK_UNSEEN_VARIANTS else ''} |"
          for v, d in ESPEAK_VARIANTS.items()),
        "",
        f"## flite ({len(FLITE_VOICES)} voices)",
        "",
        "`awb_time` (a talking clock that says only times) is not used. Pitch: `int_f0_target_mean`, rate: "
        "`duration_stretch`.",
        "",
        "| voice | how it sounds |",
        "|---|---|",
        *(f"| `{v}` | {d[0].upper() + d[1:]}{' (held out: test_flite)' if v in FLITE_UNSEEN_VOICES else ''} |"
          for v, d in FLITE_VOICES.items()),
        "",
    ]
    return "\n".join(lines)
