"""The festival voices of SynthGRID and how each of them speaks English.

Three voices are English (Debian ``festvox-kallpc16k``, ``festvox-kdlpc16k``, ``festvox-us-slt-hts``) and
speak the GRID sentences through festival's own English pipeline. Every other festival voice that Debian
ships is a voice of another language; it speaks English with an accent in the following way (one festival
process, :func:`avsr.corpora.synthgrid.festival.build_script`):

1. the English front end of ``kal_diphone`` (text analysis, CMU lexicon, phrasing, duration CART and
   linear-regression intonation with the speaker's mean pitch and pitch range) makes the utterance: words,
   syllables with lexical stress, phone segments in festival's US English ("radio") phone set with their
   durations, and F0 targets;
2. each segment is renamed into the voice's own phone set by the voice's :class:`PhoneMap` (one English phone
   may become several, e.g. a diphthong two vowels, sharing its duration; or none);
3. the foreign voice makes the waveform from that utterance: diphone voices (UniSyn residual-excited LPC)
   follow the English durations and F0 targets exactly, the HTS voice (``upc_ca_ona_hts``) takes its own
   durations and F0 from its models for the renamed phones, the cluster-unit voice (``msu_ru_nsh_clunits``)
   selects recorded units.

The phone segments written for the mouth rendering are always the English ones (each English phone spans the
target phones it became), so that the visemes are those of English articulation.

The maps are accented English as a speaker of that language would say it: the nearest native phone for each
English one (a native speaker's substitution, e.g. Italian /t/ for English /th/, Hindi retroflex /T/ for
English alveolar /t/, Czech and Russian /v/ for /w/), English diphthongs as two native vowels, and the
native stressed vowel variants (Italian ``a1``, Catalan ``a1``, Russian ``aa``) in syllables with English
lexical stress. They were checked against each voice's diphone inventory (:func:`diphone_inventory`; a
diphone the voice lacks would be replaced by silence): every diphone of every GRID sentence exists for every
diphone voice (``tests/test_voices.py``).

Sources: festival's phone sets (``PhoneSet.description`` of each voice), the diphone indices of the voices'
group files, the Hindi letter-to-sound rules of ``festival-hi`` (``hindi_lex.scm``: ``T``/``D`` retroflex,
``th``/``dh`` dental, ``tth``/``ddh`` aspirated dental), the Czech phone set of ``festival-czech`` (``c~`` =
/tS/, ``s~`` = /S/, ``dz~`` = /dZ/), suopuhe's Finnish phone set (``@`` = /ae/, ``7`` = /oe/, ``T`` = /th/).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from avsr.data.lexicon import PhoneLexicon

#: festival's voice directories (Debian)
FESTIVAL_VOICE_ROOT = Path("/usr/share/festival/voices")

#: the English voice whose front end (text analysis, durations, F0 targets) the mapped voices speak with
FRONT_END_VOICE = "kal_diphone"

#: the US English phones of festival's ``radio`` phone set that a map must cover (pauses included)
ENGLISH_PHONES = (
    "aa ae ah ao aw ax axr ay b ch d dh dx eh el em en er ey f g hh hv ih iy jh k l m n nx ng ow oy p r s "
    "sh t th uh uw v w y z zh pau"
).split()


@dataclass(frozen=True)
class PhoneMap:
    """A map from US English phones (festival's ``radio`` set) to the phones of another voice.

    Attributes:
        name: a name for messages (the language).
        phones: English phone -> target phones (a space-separated string; ``""`` drops the phone).
        stressed: English vowel -> target phones in a syllable with lexical stress (overrides ``phones``).
        alternatives: target phone -> substitutes (space-separated) used where the voice lacks the diphone
            of the phone with its neighbour (e.g. Czech voicing assimilation: d -> t before a voiceless
            consonant, t -> d before a voiced one), see :func:`diphone_repairs`.
        fillers: phones that may be inserted between two phones whose diphone the voice lacks, after the
            glides and the pause (e.g. a breathy ``h`` before a word-initial ``l`` after a pause).
    """

    name: str
    phones: dict[str, str]
    stressed: dict[str, str] = field(default_factory=dict)
    alternatives: dict[str, str] = field(default_factory=dict)
    fillers: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise ValueError naming an English phone without an entry."""
        missing = [p for p in ENGLISH_PHONES if p not in self.phones]
        if missing:
            raise ValueError(f"phone map {self.name}: no entry for English phone(s) {missing}")

    def target(self, phone: str, stressed: bool = False) -> tuple[str, ...]:
        """The target phones of one English phone (empty: dropped).

        Raises:
            KeyError: not an English phone of the map.
        """
        if stressed and phone in self.stressed:
            return tuple(self.stressed[phone].split())
        return tuple(self.phones[phone].split())

    def map(self, phones: list[tuple[str, bool]]) -> list[str]:
        """Map a sequence of ``(english_phone, stressed)`` to the target phone sequence."""
        return [t for p, s in phones for t in self.target(p, s)]

    def scheme(self) -> str:
        """The map as a Scheme association list ``((eng (t1 t2 ..) [(stressed ..)]) ..)`` for festival."""

        def lst(s: str) -> str:
            return "(" + " ".join(f'"{p}"' for p in s.split()) + ")"

        rows = []
        for eng in sorted(self.phones):
            row = f'("{eng}" {lst(self.phones[eng])}'
            if eng in self.stressed:
                row += f" {lst(self.stressed[eng])}"
            rows.append(row + ")")
        return "'(" + " ".join(rows) + ")"


def _extend(base: PhoneMap, name: str, phones: dict[str, str], alternatives: dict[str, str] | None = None,
            fillers: tuple[str, ...] = ()) -> PhoneMap:
    return PhoneMap(name, {**base.phones, **phones}, dict(base.stressed),
                    {**base.alternatives, **(alternatives or {})}, base.fillers + fillers)


# --- Italian (festvox-italp16k lp_diphone, festvox-itapc16k pc_diphone; pause "#") -----------------------
# Seven vowels i e E a o O u (stressed i1 e1 E1 a1 o1 O1 u1), glides j w, affricates tS dZ ts dz. No schwa
# (English /ax/ -> a), no /h/ (dropped), no dental fricatives (/th/ -> t, /dh/ -> d), no /ae/ (-> E).
# Where two vowels meet across words (BLUE AT) a glide is inserted (blu w at), as the databases lack V-V.
# Diphthongs as two vowels; /y/ -> j; /sh/ -> S, /zh/ -> Z, /ch/ -> tS, /jh/ -> dZ. Stressed variants only
# for the vowels whose V1-V diphones the databases have in GRID contexts.
ITALIAN = PhoneMap(
    "italian",
    {
        "aa": "a", "ae": "E", "ah": "a", "ao": "O", "aw": "a u", "ax": "a", "axr": "e r", "ay": "a i",
        "b": "b", "ch": "tS", "d": "d", "dh": "d", "dx": "d", "eh": "E", "el": "l", "em": "m", "en": "n",
        "er": "e r", "ey": "e i", "f": "f", "g": "g", "hh": "", "hv": "", "ih": "i", "iy": "i", "jh": "dZ",
        "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "ng", "ow": "o u", "oy": "O i", "p": "p",
        "r": "r", "s": "s", "sh": "S", "t": "t", "th": "t", "uh": "u", "uw": "u", "v": "v", "w": "w",
        "y": "j", "z": "z", "zh": "Z", "pau": "#",
    },
    {"aa": "a1", "ah": "a1", "ao": "O1", "aw": "a1 u", "ay": "a1 i", "eh": "E1", "ey": "e1 i", "iy": "i1",
     "ow": "o1 u", "uw": "u1"},
)  # fmt: skip

# --- Czech (festvox-czech-dita, -krb, -machac, -ph; festival-czech phone set; pause "#") ------------------
# Short/long vowels a e i o u / a: e: i: o: u: (English tense vowels long), c~ = /tS/, dz~ = /dZ/, s~ = /S/,
# z~ = /Z/, ch = /x/, n* = velar nasal. No /w/ (-> v, as Czech speakers say it), no dental fricatives
# (/th/ -> t, /dh/ -> d), no /ae/ (-> e), schwa -> e. The databases follow Czech voicing assimilation (no
# voiced obstruent before a voiceless one or a pause): there the voiceless partner is used (WITH P -> t p),
# and a short pause between consonants that Czech never joins (SET BLUE -> t # b).
CZECH = PhoneMap(
    "czech",
    {
        "aa": "a:", "ae": "e", "ah": "a", "ao": "o:", "aw": "a u", "ax": "e", "axr": "e r", "ay": "a j",
        "b": "b", "ch": "c~", "d": "d", "dh": "d", "dx": "d", "eh": "e", "el": "l", "em": "m", "en": "n",
        "er": "e r", "ey": "e j", "f": "f", "g": "g", "hh": "h", "hv": "h", "ih": "i", "iy": "i:",
        "jh": "dz~", "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "n*", "ow": "o u", "oy": "o j",
        "p": "p", "r": "r", "s": "s", "sh": "s~", "t": "t", "th": "t", "uh": "u", "uw": "u:", "v": "v",
        "w": "v", "y": "j", "z": "z", "zh": "z~", "pau": "#",
    },
    alternatives={"b": "p", "d": "t", "g": "k", "v": "f", "z": "s", "z~": "s~", "dz~": "c~",
                  "p": "b", "t": "d", "k": "g", "f": "v", "s": "z", "s~": "z~", "c~": "dz~"},
)  # fmt: skip

# --- Finnish (festvox-suopuhe-mv hy_fi_mv_diphone, festvox-suopuhe-lj suo_fi_lj_diphone; pause "#") -------
# Vowels a e i o u y @ (/ae/) 7 (/oe/), long a: e: ...; no voiced sibilants (/z/ -> s, as Finnish speakers
# devoice it), no affricates (/ch/ -> t S, /jh/ -> d S), /th/ -> T (mv's dental fricative), /dh/ -> d, /ae/ ->
# @, English tense vowels long. mv has /S/, /w/ and /T/; lj lacks them (its map: /S/ -> s, /w/ -> v, /T/ -> t)
# and the diphones of /l/ after a pause (a breathy h before it: LAY after a pause -> h l e i) and of some
# consonant pairs across words.
FINNISH = PhoneMap(
    "finnish",
    {
        "aa": "a:", "ae": "@", "ah": "a", "ao": "o:", "aw": "a u", "ax": "e", "axr": "e r", "ay": "a i",
        "b": "b", "ch": "t S", "d": "d", "dh": "d", "dx": "d", "eh": "e", "el": "l", "em": "m", "en": "n",
        "er": "e r", "ey": "e i", "f": "f", "g": "g", "hh": "h", "hv": "h", "ih": "i", "iy": "i:",
        "jh": "d S", "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "N", "ow": "o u", "oy": "o i",
        "p": "p", "r": "r", "s": "s", "sh": "S", "t": "t", "th": "T", "uh": "u", "uw": "u:", "v": "v",
        "w": "w", "y": "j", "z": "s", "zh": "S", "pau": "#",
    },
)  # fmt: skip
FINNISH_LJ = _extend(
    FINNISH, "finnish (lj)", {"ch": "t s", "jh": "d s", "sh": "s", "zh": "s", "th": "t", "w": "v"},
    {"d": "t", "f": "v"},
    ("h",),
)

# --- Hindi NSK (festvox-hi-nsk hindi_NSK_diphone; festvox-mr-nsk and -te-nsk hold the same diphone
# database, so only the Hindi one is used; pause "pau") -----------------------------------------------------
# Indian English: alveolar /t d/ -> retroflex T D, /th/ -> tth (aspirated dental), /dh/ -> dh (dental),
# /w/ -> v, /z/ -> zh (the database's only voiced sibilant), /ey/ and /ow/ as the monophthongs eh and oh,
# /ae/ -> eh, schwa -> a, /ay/ -> aa ih, /aw/ -> aa uh; zh has few diphones: a short pause before it after
# consonants, s before a pause (PLEASE -> p l iy s).
HINDI = PhoneMap(
    "hindi",
    {
        "aa": "aa", "ae": "eh", "ah": "a", "ao": "oo", "aw": "aa uh", "ax": "a", "axr": "a r", "ay": "aa ih",
        "b": "b", "ch": "ch", "d": "D", "dh": "dh", "dx": "D", "eh": "eh", "el": "l", "em": "m", "en": "n",
        "er": "a r", "ey": "eh", "f": "f", "g": "g", "hh": "h", "hv": "h", "ih": "ih", "iy": "iy",
        "jh": "j", "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "n", "ow": "oh", "oy": "oo ih",
        "p": "p", "r": "r", "s": "s", "sh": "sh", "t": "T", "th": "tth", "uh": "uh", "uw": "uw", "v": "v",
        "w": "v", "y": "y", "z": "zh", "zh": "zh", "pau": "pau",
    },
    alternatives={"zh": "s"},
)  # fmt: skip

# --- Russian (festvox-ru msu_ru_nsh_clunits, cluster units; pause "pau") --------------------------------
# Hard consonants; stressed vowels ii ee aa oo uu, unstressed i e a u (no unstressed o: it is reduced to a,
# as in Russian); /w/ -> v, /th/ -> s,
# /dh/ -> z (the usual Russian substitutions), /h/ -> h, /jh/ -> d zh, /ae/ -> e, /ih/ -> i.
RUSSIAN = PhoneMap(
    "russian",
    {
        "aa": "a", "ae": "e", "ah": "a", "ao": "a", "aw": "a u", "ax": "a", "axr": "e r", "ay": "a j",
        "b": "b", "ch": "ch", "d": "d", "dh": "z", "dx": "d", "eh": "e", "el": "l", "em": "m", "en": "n",
        "er": "e r", "ey": "e j", "f": "f", "g": "g", "hh": "h", "hv": "h", "ih": "i", "iy": "i",
        "jh": "d zh", "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "n", "ow": "a u", "oy": "a j",
        "p": "p", "r": "r", "s": "s", "sh": "sh", "t": "t", "th": "s", "uh": "u", "uw": "u", "v": "v",
        "w": "v", "y": "j", "z": "z", "zh": "zh", "pau": "pau",
    },
    {"aa": "aa", "ae": "ee", "ah": "aa", "ao": "oo", "aw": "aa u", "ay": "aa j", "eh": "ee", "ey": "ee j",
     "ih": "i", "iy": "ii", "ow": "oo u", "oy": "oo j", "uw": "uu"},
)  # fmt: skip

# --- Catalan (festvox-ca-ona-hts upc_ca_ona_hts, HTS; pause "pau") ---------------------------------------
# Central Catalan: schwa ax, open E O, stressed a1 e1 E1 i1 o1 O1 u1, glides j w, no affricate phones
# (/ch/ -> t S, /jh/ -> d Z), no /v/ (-> f, keeping V apart from B), no /h/ (dropped), /th/ -> t, /dh/ -> d.
CATALAN = PhoneMap(
    "catalan",
    {
        "aa": "a", "ae": "E", "ah": "a", "ao": "O", "aw": "a w", "ax": "ax", "axr": "ax r", "ay": "a j",
        "b": "b", "ch": "t S", "d": "d", "dh": "d", "dx": "d", "eh": "E", "el": "l", "em": "m", "en": "n",
        "er": "ax r", "ey": "e j", "f": "f", "g": "g", "hh": "", "hv": "", "ih": "i", "iy": "i", "jh": "d Z",
        "k": "k", "l": "l", "m": "m", "n": "n", "nx": "n", "ng": "n", "ow": "o w", "oy": "O j", "p": "p",
        "r": "r", "s": "s", "sh": "S", "t": "t", "th": "t", "uh": "u", "uw": "u", "v": "f", "w": "w",
        "y": "j", "z": "z", "zh": "Z", "pau": "pau",
    },
    {"aa": "a1", "ae": "E1", "ah": "a1", "ao": "O1", "aw": "a1 w", "ay": "a1 j", "eh": "E1", "ey": "e1 j",
     "ih": "i1", "iy": "i1", "ow": "o1 w", "oy": "O1 j", "uh": "u1", "uw": "u1"},
)  # fmt: skip


@dataclass(frozen=True)
class Voice:
    """One festival voice of the corpus.

    Attributes:
        name: festival's voice name (``(voice_<name>)``).
        package: the Debian package that installs it.
        language: the language of the voice's recordings.
        sex: ``female``, ``male`` or ``child``.
        engine: ``diphone`` (UniSyn residual-excited LPC), ``hts`` (hts_engine) or ``clunits``.
        f0_range: ``(low, high)`` mean pitch in Hz of this voice's speakers (diphone engine: the target of
            the intonation model; others: what the voice itself produces, shifted only by tape speed).
        phone_map: the English-to-voice phone map, None for an English voice.
        description: how it sounds (checked on spectrograms and by a cross-validated recogniser, see
            ``recipes/synthgrid/avsr1/RESULTS.md``).
    """

    name: str
    package: str
    language: str
    sex: str
    engine: str
    f0_range: tuple[float, float]
    phone_map: PhoneMap | None = None
    description: str = ""

    @property
    def english(self) -> bool:
        """Whether festival's own English pipeline speaks with this voice."""
        return self.phone_map is None


#: every voice the corpus can use, by festival name
VOICES: dict[str, Voice] = {
    v.name: v
    for v in (
        Voice("kal_diphone", "festvox-kallpc16k", "en-US", "male", "diphone", (80.0, 150.0), None,
              "US English male diphone voice, clear but buzzy LPC"),
        Voice("ked_diphone", "festvox-kdlpc16k", "en-US", "male", "diphone", (80.0, 150.0), None,
              "US English male diphone voice, darker than kal"),
        Voice("cmu_us_slt_arctic_hts", "festvox-us-slt-hts", "en-US", "female", "hts", (150.0, 200.0), None,
              "US English female HMM voice, smooth and slightly muffled"),
        Voice("lp_diphone", "festvox-italp16k", "it", "female", "diphone", (170.0, 250.0), ITALIAN,
              "Italian female diphone voice: English with Italian vowels and trilled r"),
        Voice("pc_diphone", "festvox-itapc16k", "it", "male", "diphone", (85.0, 150.0), ITALIAN,
              "Italian male diphone voice: English with Italian vowels and trilled r"),
        Voice("czech_dita", "festvox-czech-dita", "cs", "female", "diphone", (170.0, 250.0), CZECH,
              "Czech adult female diphone voice"),
        Voice("czech_krb", "festvox-czech-krb", "cs", "child", "diphone", (220.0, 300.0), CZECH,
              "Czech child (boy) diphone voice: short vocal tract, high formants"),
        Voice("czech_machac", "festvox-czech-machac", "cs", "male", "diphone", (85.0, 150.0), CZECH,
              "Czech adult male diphone voice"),
        Voice("czech_ph", "festvox-czech-ph", "cs", "male", "diphone", (85.0, 150.0), CZECH,
              "Czech male diphone voice (a second recording setup)"),
        Voice("hy_fi_mv_diphone", "festvox-suopuhe-mv", "fi", "male", "diphone", (85.0, 150.0), FINNISH,
              "Finnish male diphone voice"),
        Voice("suo_fi_lj_diphone", "festvox-suopuhe-lj", "fi", "female", "diphone", (170.0, 250.0),
              FINNISH_LJ, "Finnish female diphone voice"),
        Voice("hindi_NSK_diphone", "festvox-hi-nsk", "hi", "male", "diphone", (90.0, 160.0), HINDI,
              "Indian male diphone voice (the Hindi/Marathi/Telugu NSK database): Indian English"),
        Voice("msu_ru_nsh_clunits", "festvox-ru", "ru", "male", "clunits", (90.0, 140.0), RUSSIAN,
              "Russian male unit-selection voice: natural timbre, choppy joins"),
        Voice("upc_ca_ona_hts", "festvox-ca-ona-hts", "ca", "female", "hts", (170.0, 230.0), CATALAN,
              "Catalan female HMM voice with its own durations and intonation"),
    )
}  # fmt: skip

#: the voices of the test split of the first SynthGRID corpora (kept so that its files stay the same)
LEGACY_VOICES = ("cmu_us_slt_arctic_hts", "kal_diphone", "ked_diphone")

#: voices held out of training: the speakers of the ``test_unseen_voice`` split
UNSEEN_VOICES = ("pc_diphone", "upc_ca_ona_hts")

#: the cycle of voices of the training, validation and training-babble speakers of the ``voices``
#: training corpus (speaker i speaks with entry i mod len): every accented voice once, each followed by one
#: of the three English voices in turn, so that half of the speakers speak native English and the accented
#: voices add diversity around them (see recipes/synthgrid/avsr1/RESULTS.md for what it gave at the default
#: budget).
TRAIN_VOICES = tuple(
    name
    for i, accented in enumerate(v for v in VOICES if v not in UNSEEN_VOICES and v not in LEGACY_VOICES)
    for name in (accented, LEGACY_VOICES[i % len(LEGACY_VOICES)])
)


def voice(name: str) -> Voice:
    """The :class:`Voice` called ``name``.

    Raises:
        KeyError: unknown voice (the known ones are listed).
    """
    try:
        return VOICES[name]
    except KeyError:
        raise KeyError(f"unknown festival voice {name!r}; known: {sorted(VOICES)}") from None


def voice_dir(name: str, root: Path = FESTIVAL_VOICE_ROOT) -> Path | None:
    """The installed directory of voice ``name`` (``<root>/<language>/<name>``), None if not installed."""
    found = sorted(root.glob(f"*/{name}"))
    return found[0] if found else None


def installed_voices(root: Path = FESTIVAL_VOICE_ROOT) -> list[str]:
    """The voices of :data:`VOICES` installed under ``root`` (sorted)."""
    return sorted(name for name in VOICES if voice_dir(name, root) is not None)


def htsvoice_file(name: str, root: Path = FESTIVAL_VOICE_ROOT) -> Path:
    """The ``.htsvoice`` model file of an installed HTS voice.

    Raises:
        FileNotFoundError: the voice is not installed or has no ``hts/*.htsvoice`` file.
    """
    vdir = voice_dir(name, root)
    files = sorted(vdir.glob("hts/*.htsvoice")) if vdir is not None else []
    if not files:
        raise FileNotFoundError(f"no .htsvoice file for festival voice {name} under {root}")
    return files[0]


_ALPHA_RE = re.compile(rb"OPTION\[MCP\]:ALPHA=([0-9.]+)")


def htsvoice_alpha(data: bytes) -> float:
    """The all-pass constant (frequency-warping ``ALPHA``) in the header of an htsvoice file.

    Raises:
        ValueError: no ``OPTION[MCP]:ALPHA=`` entry.
    """
    m = _ALPHA_RE.search(data[:8192])
    if m is None:
        raise ValueError("htsvoice file has no OPTION[MCP]:ALPHA entry")
    return float(m.group(1))


def warp_htsvoice(data: bytes, alpha: float) -> bytes:
    """A copy of an htsvoice file whose mel-cepstral synthesis filter uses all-pass constant ``alpha``.

    The spectral envelope is stored as mel-cepstra for the voice's own ``ALPHA``; synthesising them with
    another all-pass constant warps the frequency axis (hts_engine's MLSA filter): a smaller ``alpha`` moves
    the formants up (a shorter vocal tract), a larger one down, while F0 and durations stay. Festival's HTS
    module reads only ``-m`` and ``-r`` of ``hts_engine_params``, so the warping goes into the model file.
    The number keeps its width so that the data offsets of the header stay valid.

    Args:
        data: the bytes of an htsvoice file.  alpha: the new all-pass constant, in (0, 1).

    Returns:
        the modified bytes (same length).

    Raises:
        ValueError: ``alpha`` outside (0, 1) or no ``ALPHA`` entry.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"all-pass constant alpha must be in (0, 1), got {alpha}")
    m = _ALPHA_RE.search(data[:8192])
    if m is None:
        raise ValueError("htsvoice file has no OPTION[MCP]:ALPHA entry")
    width = len(m.group(1))
    new = f"{alpha:.{max(width - 2, 2)}f}".encode()[:width].ljust(width, b"0")
    return data[: m.start(1)] + new + data[m.end(1) :]


@functools.cache
def diphone_inventory(name: str, root: Path = FESTIVAL_VOICE_ROOT) -> frozenset[str]:
    """The diphones (``"a-b"``) in the group file of an installed diphone voice.

    Reads the index of festival's grouped diphone database (``group/*.group``: an ``EST_File index`` header,
    then one line per diphone).

    Raises:
        FileNotFoundError: the voice is not installed or has no group file.
        ValueError: the index cannot be read.
    """
    vdir = voice_dir(name, root)
    groups = sorted(vdir.glob("group/*.group")) if vdir is not None else []
    if not groups:
        raise FileNotFoundError(f"no diphone group file for festival voice {name} under {root}")
    with open(groups[0], "rb") as f:
        head = f.read(1 << 20)
    header, sep, rest = head.partition(b"EST_Header_End\n")
    count = re.search(rb"NumEntries (\d+)", header)
    if not sep or count is None:
        raise ValueError(f"{groups[0]}: not a festival diphone index")
    lines = rest.split(b"\n")[: int(count.group(1))]
    return frozenset(line.split()[0].decode("latin-1") for line in lines if line.strip())


#: how festival's English front end (kal_diphone, CMU lexicon) says each GRID word inside a GRID sentence:
#: ``(phone, stressed)`` per phone; ``tests/test_voices.py`` checks it against festival
ENGLISH_PRONUNCIATIONS: dict[str, tuple[tuple[str, bool], ...]] = {
    word: tuple((p.split(":")[0], p.endswith(":1")) for p in phones.split())
    for word, phones in {
        "BIN": "b:1 ih:1 n:1", "LAY": "l:1 ey:1", "PLACE": "p:1 l:1 ey:1 s:1", "SET": "s:1 eh:1 t:1",
        "BLUE": "b:1 l:1 uw:1", "GREEN": "g:1 r:1 iy:1 n:1", "RED": "r:1 eh:1 d:1", "WHITE": "w:1 ay:1 t:1",
        "AT": "ae:1 t:1", "BY": "b:1 ay:1", "IN": "ih:0 n:0", "WITH": "w:1 ih:1 dh:1",
        "A": "ey:1", "B": "b:1 iy:1", "C": "s:1 iy:1", "D": "d:1 iy:1", "E": "iy:1", "F": "eh:1 f:1",
        "G": "jh:1 iy:1", "H": "ey:1 ch:1", "I": "ay:1", "J": "jh:1 ey:1", "K": "k:1 ey:1", "L": "eh:1 l:1",
        "M": "eh:1 m:1", "N": "eh:1 n:1", "O": "ow:1", "P": "p:1 iy:1", "Q": "k:1 y:1 uw:1", "R": "aa:1 r:1",
        "S": "eh:1 s:1", "T": "t:1 iy:1", "U": "y:1 uw:1", "V": "v:1 iy:1", "X": "eh:1 k:1 s:1",
        "Y": "w:1 ay:1", "Z": "z:1 iy:1",
        "ZERO": "z:1 ih:1 r:0 ow:0", "ONE": "w:1 ah:1 n:1", "TWO": "t:1 uw:1", "THREE": "th:1 r:1 iy:1",
        "FOUR": "f:1 ao:1 r:1", "FIVE": "f:1 ay:1 v:1", "SIX": "s:1 ih:1 k:1 s:1",
        "SEVEN": "s:1 eh:1 v:0 ax:0 n:0", "EIGHT": "ey:1 t:1", "NINE": "n:1 ay:1 n:1",
        "AGAIN": "ax:0 g:1 eh:1 n:1", "NOW": "n:1 aw:1", "PLEASE": "p:1 l:1 iy:1 z:1", "SOON": "s:1 uw:1 n:1",
    }.items()
}  # fmt: skip


def english_lexicon() -> PhoneLexicon:
    """The GRID words as festival's English front end says them (:data:`ENGLISH_PRONUNCIATIONS`, stress
    dropped): the phone targets of the phone CTC loss (``<corpus>/lexicon.txt``, ``avsr.bin.train
    --phone-lexicon``). 51 words, 33 phones; one canonical pronunciation per word whatever the engine or
    accent that spoke it."""
    return PhoneLexicon({w: [p for p, _ in phones] for w, phones in ENGLISH_PRONUNCIATIONS.items()},
                        name="the GRID lexicon")


#: English vowels (their targets are the vowels of a map, for the choice of repair)
_ENGLISH_VOWELS = ("aa", "ae", "ah", "ao", "aw", "ax", "axr", "ay", "eh", "er", "ey", "ih", "iy", "ow", "oy",
                   "uh", "uw")


def _windows(phone_map: PhoneMap) -> list[list[str]]:
    """The target phones of every run of three neighbouring GRID words (with the voice's pause before the
    first and after the last word of a sentence): every phone context a repair can reach."""
    from avsr.corpora.synthgrid.grammar import SLOTS

    pause = phone_map.target("pau")[0]
    mapped = {w: phone_map.map(list(p)) for w, p in ENGLISH_PRONUNCIATIONS.items()}
    windows = []
    for first in range(len(SLOTS) - 2):
        for a in SLOTS[first]:
            for b in SLOTS[first + 1]:
                for c in SLOTS[first + 2]:
                    seq = mapped[a] + mapped[b] + mapped[c]
                    seq = ([pause] if first == 0 else []) + seq + ([pause] if first + 3 == len(SLOTS) else [])
                    windows.append(seq)
    return windows


def _repair_options(a: str, b: str, phone_map: PhoneMap, vowels: set[str]) -> list[tuple[str, str]]:
    pause = phone_map.target("pau")[0]
    options: list[tuple[str, str]] = []
    if a in vowels and b in vowels:
        options += [("insert", g) for g in (("j", "w", "u") if a[0] in "ie" else ("w", "u", "j"))]
    options += [("first", x) for x in phone_map.alternatives.get(a, "").split()]
    options += [("insert", pause)] if pause not in (a, b) else []
    options += [("second", x) for x in phone_map.alternatives.get(b, "").split()]
    options += [("insert", x) for x in phone_map.fillers]
    return options


def diphone_repairs(phone_map: PhoneMap, inventory: frozenset[str] | set[str]) -> dict[str, tuple[str, str]]:
    """How a diphone voice says the GRID phone pairs it has no diphone for.

    For each phone pair of the GRID sentences whose diphone is missing from ``inventory``, the first repair
    whose diphones exist: between two vowels a glide (``j`` after a front vowel, else ``w`` or ``u``); an
    ``alternatives`` substitute of the first phone (regressive assimilation, as in Czech); a short pause
    between them; a substitute of the second phone; a filler of the map between them (festival would
    otherwise put silence in place of the missing diphone, ``UniSyn: using default diphone``). A repair can
    make a new pair (X ZERO in Czech: s z -> z z, then k z), so the search runs over every three-word
    context with the repairs so far until no new missing pair appears; festival applies the repairs the
    same way (:func:`apply_repairs`).

    Returns:
        ``"a-b"`` -> ``("insert", x)`` (x between a and b), ``("first", x)`` (a becomes x) or
        ``("second", x)`` (b becomes x). Pairs without any repair are left out.
    """
    consonants = {t for p in ENGLISH_PHONES if p not in _ENGLISH_VOWELS and p != "pau"
                  for t in phone_map.target(p)}
    vowels = {t for p in _ENGLISH_VOWELS for t in phone_map.target(p) + phone_map.target(p, True)}
    vowels -= consonants
    windows = _windows(phone_map)
    repairs: dict[str, tuple[str, str]] = {}
    unrepairable: set[str] = set()
    for _ in range(5):
        missing = set()
        for seq in windows:
            seq = apply_repairs(seq, repairs)
            missing |= {f"{a}-{b}" for a, b in zip(seq, seq[1:])}
        missing = {p for p in missing if p not in inventory and p not in repairs and p not in unrepairable}
        if not missing:
            break
        for pair in sorted(missing):
            a, b = pair.split("-", 1)
            for kind, x in _repair_options(a, b, phone_map, vowels):
                new = {"insert": (f"{a}-{x}", f"{x}-{b}"), "first": (f"{x}-{b}",),
                       "second": (f"{a}-{x}",)}[kind]
                if all(d in inventory for d in new):
                    repairs[pair] = (kind, x)
                    break
            else:
                unrepairable.add(pair)
    return repairs


def apply_repairs(phones: list[str], repairs: dict[str, tuple[str, str]], passes: int = 3) -> list[str]:
    """Apply diphone repairs to a target phone sequence as festival's ``avsr_repair`` does (left to right,
    ``passes`` times)."""
    seq = list(phones)
    for _ in range(passes):
        i = 0
        while i + 1 < len(seq):
            fix = repairs.get(f"{seq[i]}-{seq[i + 1]}")
            if fix is not None:
                kind, x = fix
                if kind == "first":
                    seq[i] = x
                elif kind == "second":
                    seq[i + 1] = x
                else:
                    seq.insert(i + 1, x)
                    i += 1
            i += 1
    return seq


def sentence_phones(words: tuple[str, ...] | list[str], phone_map: PhoneMap) -> list[str]:
    """The target phones of a GRID sentence with the voice's pauses around it (before repairs)."""
    pause = phone_map.target("pau")[0]
    return [pause] + [t for w in words for t in phone_map.map(list(ENGLISH_PRONUNCIATIONS[w]))] + [pause]


def repairs_scheme(repairs: dict[str, tuple[str, str]]) -> str:
    """The repairs as a Scheme association list ``(("a-b" kind "x") ...)`` for festival."""
    return "'(" + " ".join(f'("{k}" {kind} "{x}")' for k, (kind, x) in sorted(repairs.items())) + ")"
