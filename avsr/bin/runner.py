"""One error convention for every command-line tool.

A tool's ``main`` is wrapped by :func:`tool`: errors that the user can act on -- the project's own error types
(a bad configuration, a bad utterance, an unreadable media file or checkpoint, ...) and the predictable
operating-system errors (missing file, permission, disk full) -- are printed as one line::

    avsr-<tool>: error: <what> (<which file / utterance id / config key and file>)

and the tool exits with status 2 for usage and configuration errors, 1 for data and runtime errors. The
messages of the project's errors already name their file, utterance or key. ``--debug`` on the command line
(or the environment variable ``AVSR_DEBUG=1``) shows the traceback instead. Anything else -- a genuine bug --
is not caught and shows its traceback as usual.

:class:`HelpFormatter` gives the tools' ``--help`` one look: the description in paragraphs, each option's
default.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import textwrap
from collections.abc import Callable

from avsr.config import UsageError  # defined beside ConfigError, so that library code can raise it

__all__ = ["UsageError", "data_errors", "usage_errors", "tool", "debug_requested", "HelpFormatter"]


def usage_errors() -> tuple[type[BaseException], ...]:
    """The errors reported as usage and configuration errors (exit status 2)."""
    from avsr.config import ConfigError

    return (UsageError, ConfigError)


@functools.cache
def data_errors() -> tuple[type[BaseException], ...]:
    """The errors reported as data and runtime errors (exit status 1; :class:`OSError` too).

    Imported when a tool meets an error, not before (their modules import torch, PyAV, jiwer, ...); the
    classes themselves, so that one renamed or moved fails here (and in ``tests/test_cli_errors.py``) instead
    of silently dropping out of the mapping.
    """
    from avsr.clustering.labels import LabelError
    from avsr.clustering.quality import PhoneAlignmentError, QualityReportError
    from avsr.clustering.shards import FeatureDumpError
    from avsr.compat.safe_load import CheckpointError
    from avsr.corpora.synthgrid.festival import FestivalError
    from avsr.data.datadir import DataDirError
    from avsr.data.dataset import DataError
    from avsr.data.lexicon import LexiconError
    from avsr.data.lrs3 import LRS3Error
    from avsr.data.media import MediaError
    from avsr.data.roi import RoiError
    from avsr.data.tokenizer import TokenizerError
    from avsr.decode.align import AlignmentError
    from avsr.eval.scoring import ScoringError
    from avsr.inference.types import InferenceError

    return (DataError, DataDirError, TokenizerError, LexiconError, MediaError, RoiError, LRS3Error,
            FestivalError, CheckpointError, InferenceError, ScoringError, AlignmentError, FeatureDumpError,
            LabelError, PhoneAlignmentError, QualityReportError)


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` of a tool: the description's paragraphs (write them as plain text: no reST) filled to the
    terminal's width, a paragraph with indented lines (examples) kept as written; and ``(default: X)`` after
    each option's help, unless the help already speaks of its default or the default is None, False (an off
    flag) or suppressed. Give it as ``formatter_class`` to :class:`argparse.ArgumentParser`."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for block in re.split(r"\n[ \t]*\n", text.strip("\n")):
            lines = block.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                                initial_indent=indent, subsequent_indent=indent,
                                                break_on_hyphens=False))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or default is None or default is False
                or default == argparse.SUPPRESS):
            return action.help
        return f"{text} (default: %(default)s)"


def debug_requested(argv: list[str]) -> bool:
    """Whether ``--debug`` is among the arguments or ``AVSR_DEBUG`` is set to a true value."""
    return "--debug" in argv or os.environ.get("AVSR_DEBUG", "").lower() in ("1", "true", "yes")


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
        text = f"{text} ({exc.filename})"
    return " ".join(text.split())


Main = Callable[[list[str] | None], "int | None"]


def tool(prog: str) -> Callable[[Main], Callable[[list[str] | None], int]]:
    """Decorate a tool's ``main(argv) -> status | None`` with the error convention of the module docstring.

    The wrapped ``main`` removes ``--debug`` from the arguments (the tool's parser never sees it) and returns
    the exit status (0 when the tool returned None).
    """

    def wrap(main: Main) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            args = list(sys.argv[1:] if argv is None else argv)
            debug = debug_requested(args)
            args = [a for a in args if a != "--debug"]
            try:
                status = main(args)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130
            except BaseException as exc:
                if debug or isinstance(exc, SystemExit):
                    raise
                if isinstance(exc, usage_errors()):
                    code = 2
                elif isinstance(exc, (*data_errors(), OSError)):
                    code = 1
                else:
                    raise
                print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
                return code
            return int(status or 0)

        return run

    return wrap
