"""One error convention for every command-line tool.

A tool's ``main`` is wrapped by :func:`tool`: errors that the user can act on -- the project's own error types
(a bad configuration, a bad utterance, an unreadable media file or checkpoint, ...) and the predictable
operating-system errors (missing file, permission, disk full) -- are printed as one line::

    avsr-<tool>: error: <what> (<which file / utterance id / config key and file>)

and the tool exits with status 2 for usage and configuration errors, 1 for data and runtime errors. The
messages of the project's errors already name their file, utterance or key. ``--debug`` on the command line
(or the environment variable ``AVSR_DEBUG=1``) shows the traceback instead. Anything else -- a genuine bug --
is not caught and shows its traceback as usual.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

from avsr.config import UsageError  # defined beside ConfigError, so that library code can raise it

__all__ = ["UsageError", "DATA_ERRORS", "USAGE_ERRORS", "tool", "debug_requested"]


#: (module, class) of the errors reported as usage/configuration errors (exit status 2).
USAGE_ERRORS = (("avsr.config", "UsageError"), ("avsr.config", "ConfigError"))
#: (module, class) of the errors reported as data/runtime errors (exit status 1); OSError too.
DATA_ERRORS = (
    ("avsr.data.dataset", "DataError"),
    ("avsr.data.datadir", "DataDirError"),
    ("avsr.data.tokenizer", "TokenizerError"),
    ("avsr.data.lexicon", "LexiconError"),
    ("avsr.data.media", "MediaError"),
    ("avsr.data.roi", "RoiError"),
    ("avsr.data.lrs3", "LRS3Error"),
    ("avsr.corpora.synthgrid.festival", "FestivalError"),
    ("avsr.compat.safe_load", "CheckpointError"),
    ("avsr.inference", "InferenceError"),
    ("avsr.eval.scoring", "ScoringError"),
    ("avsr.decode.align", "AlignmentError"),
    ("avsr.clustering.shards", "FeatureDumpError"),
    ("avsr.clustering.labels", "LabelError"),
    ("avsr.clustering.quality", "PhoneAlignmentError"),
    ("avsr.clustering.quality", "QualityReportError"),
)


def _classes(names: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    """The listed classes of the modules already imported (an error can only come from a loaded module)."""
    found = []
    for module, name in names:
        mod = sys.modules.get(module)
        if mod is not None and isinstance(getattr(mod, name, None), type):
            found.append(getattr(mod, name))
    return tuple(found)


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
                if isinstance(exc, _classes(USAGE_ERRORS)):
                    code = 2
                elif isinstance(exc, (*_classes(DATA_ERRORS), OSError)):
                    code = 1
                else:
                    raise
                print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
                return code
            return int(status or 0)

        return run

    return wrap
