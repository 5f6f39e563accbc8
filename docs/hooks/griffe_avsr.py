"""Griffe extension for the API reference: avsr's reST-flavoured Google docstrings, made fit for mkdocstrings.

avsr's docstrings are Google style with two habits of Sphinx/reST that the Markdown renderer does not know;
this extension rewrites each docstring of the package once it is loaded (the sources stay as they are):

- parameters documented together (``sos, eos, blank: token ids``) become one entry per name, each with the
  same description, so that mkdocstrings shows each parameter's type and default from the signature (a
  grouped entry matches no parameter: no type, and ``required`` as its default);
- Sphinx roles (``:class:`Name```, ``:func:`~avsr.x.f```, ``:meth:`__call__```) and dotted names of the
  package in code spans (````avsr.decode.DecodeConfig````) become cross-references: a name is resolved in the
  scope of the documented object (as Python would: members, imports, enclosing class and module; a dotted
  ``avsr.`` path through the package, lazily exported names of ``avsr`` included) and linked to the page
  that renders it; a name that resolves to nothing rendered stays plain code, without a warning.

mkdocs.yml loads it through the Python handler's ``extensions`` option.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: Google sections whose entries are ``name (type): description``
NAME_SECTIONS = re.compile(
    r"^(?P<indent>\s*)(Args|Arguments|Parameters|Params|Other Parameters|Keyword Args|Keyword Arguments|"
    r"Attributes|Class Attributes|Instance Attributes):\s*$"
)
#: an entry naming several parameters: ``a, b (type): description``
GROUPED = re.compile(r"^(?P<names>[\w*]+(?:\s*,\s*[\w*]+)+)(?P<type>\s*\([^()]*\))?:(?P<desc>\s.*|)$")
ROLE = re.compile(
    r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|term):`(?P<tilde>~?)(?P<target>[^`]+)`"
)
#: a dotted name of the package in a code span: ``avsr.x.Y`` or `avsr.x.Y` (a trailing ``()`` allowed)
PACKAGE_CODE = re.compile(
    r"(?<!`)(?<!optional>)(?P<ticks>``?)(?P<target>avsr(?:\.\w+)+(?:\(\))?)(?P=ticks)(?!`)"
)
FENCE = re.compile(r"^\s*(```|~~~)")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_grouped_parameters(text: str) -> str:
    """``a, b: description`` in the parameter and attribute sections -> one entry per name."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        header = NAME_SECTIONS.match(line)
        if not header:
            continue
        base = len(header["indent"])
        item_indent = None
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                out.append(line)
                i += 1
                continue
            indent = _indent(line)
            if indent <= base:
                break  # the section ends
            if item_indent is None:
                item_indent = indent
            # the entry: its first line and every more-indented line after it
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():
                j -= 1  # trailing blank lines belong to no entry
            entry = lines[i:j]
            grouped = GROUPED.match(line.strip()) if indent == item_indent else None
            if grouped:
                names = [n.strip() for n in grouped["names"].split(",")]
                for name in names:
                    out.append(f"{' ' * indent}{name}{grouped['type'] or ''}:{grouped['desc']}")
                    out.extend(entry[1:])
            else:
                out.extend(entry)
            i = j
    return "\n".join(out)


def _lazy_exports(collection: Any) -> dict[str, str]:
    """``avsr``'s lazily exported names (``_LAZY`` of ``avsr/__init__.py``: name -> module)."""
    try:
        return ast.literal_eval(str(collection["avsr"].members["_LAZY"].value))
    except Exception:  # noqa: BLE001 -- without it, ``avsr.<Name>`` links only where griffe sees the name
        return {}


def _lookup(collection: Any, path: str) -> str | None:
    """The canonical path of the object at ``path`` in the loaded packages, or None."""
    try:
        found = collection[path]
    except Exception:  # noqa: BLE001 -- KeyError, AliasResolutionError, ...: not an object we document
        parts = path.split(".")
        lazy = _lazy_exports(collection)
        if len(parts) >= 2 and parts[0] == "avsr" and parts[1] in lazy:
            return _lookup(collection, ".".join([lazy[parts[1]], *parts[1:]]))
        return None
    try:
        return found.canonical_path
    except Exception:  # noqa: BLE001 -- an alias to an object outside the loaded packages
        return None


def resolve(obj: Any, target: str) -> str | None:
    """The canonical path of ``target`` (``Name``, ``Name.attr`` or ``avsr.x.Name``) seen from ``obj``."""
    target = target.strip().removesuffix("()")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", target):
        return None
    collection = obj.modules_collection
    if target.split(".", 1)[0] == "avsr":
        return _lookup(collection, target)
    first, _, rest = target.partition(".")
    try:
        path = obj.resolve(first)
    except Exception:  # noqa: BLE001 -- NameResolutionError: a parameter, a builtin, a typo
        return None
    return _lookup(collection, f"{path}.{rest}" if rest else path)


def _crossref(identifier: str | None, title: str) -> str:
    """An optional cross-reference for mkdocs-autorefs (a link where ``identifier`` is rendered, plain code
    elsewhere), or plain code."""
    code = f"`{title}`"  # a Markdown code span, so that ``__call__`` is not read as emphasis
    if identifier is None:
        return code
    return f'<autoref identifier="{identifier}" optional>{code}</autoref>'


def link_references(text: str, obj: Any) -> str:
    """Sphinx roles and package paths in code spans -> cross-references (outside fenced code blocks)."""

    def role(m: re.Match) -> str:
        target = m["target"]
        title = target.rsplit(".", 1)[-1] if m["tilde"] else target
        return _crossref(resolve(obj, target), title)

    def package_code(m: re.Match) -> str:
        return _crossref(resolve(obj, m["target"]), m["target"])

    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = PACKAGE_CODE.sub(package_code, ROLE.sub(role, line))
        out.append(line)
    return "\n".join(out)


def _objects(obj: Any) -> Iterator[Any]:
    """``obj`` and every object defined in it (aliases left out: they are documented where defined)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class AvsrDocstrings(griffe.Extension):
    """Rewrite every docstring of a loaded package (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[int] = set()  # docstrings already rewritten (a package may be announced twice)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None and id(obj.docstring) not in self._done:
                self._done.add(id(obj.docstring))
                obj.docstring.value = link_references(split_grouped_parameters(obj.docstring.value), obj)
