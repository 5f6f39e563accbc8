"""The GRID corpus sentence grammar: ``command colour preposition letter digit adverb``.

Source: Cooke, Barker, Cunningham and Shao, "An audio-visual corpus for speech perception and automatic
speech recognition", JASA 120(5), 2006, Table I: 4 commands, 4 colours, 4 prepositions, 25 letters (no W),
10 digits, 4 adverbs, i.e. 64,000 sentences such as "bin blue at F two now". GRID names each sentence by a
six-character code of the first character of each word (``bbaf2n``); we do the same.
"""

from __future__ import annotations

import numpy as np

COMMANDS = ("BIN", "LAY", "PLACE", "SET")
COLOURS = ("BLUE", "GREEN", "RED", "WHITE")
PREPOSITIONS = ("AT", "BY", "IN", "WITH")
LETTERS = tuple(chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) != "W")
DIGITS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")
ADVERBS = ("AGAIN", "NOW", "PLEASE", "SOON")

#: the six word slots of a GRID sentence, in order
SLOTS: tuple[tuple[str, ...], ...] = (COMMANDS, COLOURS, PREPOSITIONS, LETTERS, DIGITS, ADVERBS)
#: the whole vocabulary (51 words), upper case
VOCABULARY: tuple[str, ...] = tuple(word for slot in SLOTS for word in slot)


def sample_sentence(rng: np.random.Generator) -> tuple[str, ...]:
    """Draw one sentence uniformly from the grammar.

    Args:
        rng: numpy random generator (the only source of randomness, so results are reproducible).

    Returns:
        six upper-case words, e.g. ``("BIN", "BLUE", "AT", "F", "TWO", "NOW")``.
    """
    return tuple(slot[int(rng.integers(len(slot)))] for slot in SLOTS)


def check_sentence(words: tuple[str, ...] | list[str]) -> None:
    """Check that ``words`` is a sentence of the grammar.

    Raises:
        ValueError: wrong number of words, or a word not allowed in its slot (named in the message).
    """
    if len(words) != len(SLOTS):
        raise ValueError(f"a GRID sentence has {len(SLOTS)} words, got {len(words)}: {' '.join(words)!r}")
    for position, (word, slot) in enumerate(zip(words, SLOTS)):
        if word not in slot:
            raise ValueError(
                f"word {word!r} at position {position + 1} of {' '.join(words)!r} is not one of {slot}"
            )


def transcript(words: tuple[str, ...] | list[str]) -> str:
    """The reference transcript: upper-case words joined by single spaces (``BIN BLUE AT F TWO NOW``).

    Raises:
        ValueError: ``words`` is not a sentence of the grammar.
    """
    check_sentence(words)
    return " ".join(words)


def sentence_code(words: tuple[str, ...] | list[str]) -> str:
    """GRID's six-character sentence code: first character of each word, lower case, digit as a numeral.

    Example: ``("BIN", "BLUE", "AT", "F", "TWO", "NOW")`` -> ``"bbaf2n"``. The code is unique per sentence
    (first characters differ within each slot).

    Raises:
        ValueError: ``words`` is not a sentence of the grammar.
    """
    check_sentence(words)
    chars = [word[0].lower() for word in words]
    chars[4] = str(DIGITS.index(words[4]))
    return "".join(chars)


def festival_text(words: tuple[str, ...] | list[str]) -> str:
    """The text given to festival: words in lower case except the letter, kept as one capital.

    Festival's English text analysis reads a lone capital as the letter name ("A" -> /ey/, "U" -> /y uw/)
    but the lower-case "a" as the article /ax/; lower-case words avoid being read as acronyms ("IN").

    Raises:
        ValueError: ``words`` is not a sentence of the grammar.
    """
    check_sentence(words)
    return " ".join(word if position == 3 else word.lower() for position, word in enumerate(words))
