"""The tests' way from a model to its hypotheses: the one the package takes (a :class:`Searcher` built from
the model and a search configuration resolved over the model's checkpoint decode section)."""

from __future__ import annotations

from typing import Any

from avsr.decode.config import resolve_search_config
from avsr.decode.searcher import Searcher
from avsr.inference.pretrained import checkpoint_decode_defaults


def searcher(model, config=None, defaults: dict[str, Any] | None = None, **overrides: Any) -> Searcher:
    """A searcher of ``model`` with ``config`` and ``overrides`` over ``defaults`` (default: the decode
    section that a checkpoint of ``model`` would have, :func:`checkpoint_decode_defaults`)."""
    if defaults is None:
        defaults = checkpoint_decode_defaults(model.config.to_dict())
    return Searcher(model, resolve_search_config(config, defaults, **overrides), defaults)


def decode_nbest(model, audio, video, lengths, config=None, **overrides: Any):
    """Up to ``nbest`` hypotheses per utterance (:meth:`Searcher.decode`)."""
    return searcher(model, config, **overrides).decode(audio, video, lengths).hypotheses


def decode(model, audio, video, lengths, config=None, **overrides: Any) -> list[list[int]]:
    """The best hypothesis' token ids per utterance (``[]`` where the search found none)."""
    return [h[0].tokens if h else [] for h in decode_nbest(model, audio, video, lengths, config, **overrides)]
