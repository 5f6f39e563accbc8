"""The documentation: the MkDocs site builds without a warning, the API pages carry the docstrings, and the
README is a short user document (no development history, its commands those of CI).

The site is built with ``mkdocs build --strict`` (mkdocs.yml: broken links and anchors are warnings, and
--strict makes every warning an error), by static analysis of the sources: neither torch nor ESPnet is
imported to render the API pages.
"""

from __future__ import annotations

import configparser
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

FRESH_MACHINE_COMMANDS = (
    "bash scripts/install.sh && recipes/synthgrid/avsr1/run.sh",
    "bash scripts/install.sh --dev && .venv/bin/python -m pytest -q tests && bash scripts/wheel_smoke.sh",
)
DOC_TOOLS = ("mkdocs", "mkdocstrings", "mkdocstrings-python", "mkdocs-material")


def _text(page: Path) -> str:
    """The visible text of a built HTML page."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"):
        try:
            __import__(module)
        except ImportError:
            pytest.fail(f"{module} is not installed: the doc tools come with the dev extra "
                        "(bash scripts/install.sh --dev)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    return out


def test_every_page_is_built(site):
    pages = sorted(p.relative_to(DOCS) for p in DOCS.rglob("*.md"))
    names = {str(p.with_suffix("")) for p in pages}
    assert {"index", "recipes", "own-videos", "checkpoints", "espnet", "performance", "design"} <= names
    assert {"api/encoder", "api/inference"} <= names
    for page in pages:
        built = site / (page.parent if page.name == "index.md" else page.with_suffix("")) / "index.html"
        assert built.is_file(), f"docs/{page} was not built"


def test_api_pages_render_the_docstrings(site):
    encoder = _text(site / "api" / "encoder" / "index.html")
    assert "AVHubertEncoder" in encoder
    assert "The AV-HuBERT encoder with ESPnet" in encoder  # the class docstring's first line
    assert "avhubert_base" in encoder  # the factories
    assert ":class:" not in encoder and ":meth:" not in encoder  # Sphinx roles shown as code (docs/hooks)
    inference = _text(site / "api" / "inference" / "index.html")
    assert "Transcriber" in inference and "from_pretrained" in inference
    espnet = _text(site / "api" / "espnet" / "index.html")
    assert "AVHubertESPnetEncoder" in espnet  # documented without ESPnet installed
    for name in ("AVSRModel", "DecodeConfig", "GradMultiply", "avhubert_audio_features"):
        assert any(name in _text(p) for p in (site / "api").rglob("index.html")), name


def _parameters(page: str, identifier: str) -> dict[str, tuple[str, str]]:
    """The Parameters table of one rendered API object: name -> (type, default), as the page shows them."""
    start = page.index(f'id="{identifier}" class="doc doc-heading"') + len(identifier)
    end = page.find('class="doc doc-heading"', start + 30)  # the next object's heading
    section = page[start:end if end > 0 else None]
    table = re.search(r'doc-section-title">Parameters:</span>.*?<tbody>(.*?)</tbody>', section, re.S)
    assert table, f"no Parameters table for {identifier}"
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(1), re.S):
        cells = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split())
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        rows[cells[0]] = (cells[1], cells[-1])
    return rows


def test_api_reference_shows_call_types_defaults_and_links(site):
    """``Transcriber.__call__`` is rendered (private members are not), parameters documented together
    ("noise, snr_db: ...") get their own types and defaults from the signature, Sphinx roles are links."""
    page = (site / "api" / "inference" / "index.html").read_text(encoding="utf-8")
    assert 'id="avsr.inference.transcriber.Transcriber.__call__"' in page
    assert 'id="avsr.inference.transcriber.Transcriber._' not in page.replace("__call__", "")  # private
    call = _parameters(page, "avsr.inference.transcriber.Transcriber.__call__")
    assert call["video"] == call["audio"] == ("PathLike | ndarray | Tensor | None", "None")
    assert call["sample_rate"] == ("int | None", "None")
    batch = _parameters(page, "avsr.inference.transcriber.Transcriber.transcribe_batch")
    assert batch["items"][1] == "required"
    assert batch["noise"] == ("PathLike | Tensor | NoiseSource | None", "None")
    assert batch["snr_db"] == ("float | None", "None")
    assert batch["window"] == ("int", "512") and batch["strict"] == ("bool", "False")
    assert "noise, snr_db" not in batch
    # ":meth:`__call__`" in transcribe_batch's docstring: a link to __call__'s entry
    assert 'href="#avsr.inference.transcriber.Transcriber.__call__"><code>__call__</code></a>' in page
    for built in (site / "api").rglob("index.html"):
        text = _text(built)
        assert ":class:" not in text and ":meth:" not in text and ":func:" not in text, built


def test_nav_names_the_api_reference_once(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    entries = re.findall(r'<span class="md-ellipsis">\s*API reference\s*</span>', home)
    assert len(entries) == 1, "the nav lists 'API reference' as a section and again as its first page"


def _dev_extra() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    return cfg["options.extras_require"]["dev"]


def test_doc_tools_are_in_the_dev_extra_and_pinned():
    dev = _dev_extra()
    pins = dict(line.split("==", 1) for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for tool in DOC_TOOLS:
        assert re.search(rf"^\s*{re.escape(tool)}\b", dev, re.M), f"{tool} is missing from the dev extra"
        assert tool in pins, f"{tool} is not pinned in constraints.txt"


# --------------------------------------------------------------------------------------------------- README
URL = re.compile(r"https?://[^\s)>\]]+")
COMMIT_LIKE = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
HISTORY = re.compile(r"\b(issue|stop)\s+#?\d+\b|#\d+\b(?!-)", re.I)  # not a dated anchor (#2026-11-28-...)


def user_docs() -> list[Path]:
    """The markdown a user reads: the README, the documentation and the recipes' pages (RESULTS.md and its
    log included; machine-written tables hold no hexadecimal words of 7 or more characters either)."""
    return [README, *sorted(DOCS.rglob("*.md")), *sorted((REPO / "recipes").rglob("*.md"))]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move the details into docs/"


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_user_docs_name_no_commits_or_issues(path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = URL.sub(" ", line)
        assert not COMMIT_LIKE.search(text), f"{path.name}:{number}: a commit id: {line}"
        assert not HISTORY.search(text), f"{path.name}:{number}: development history: {line}"


def test_commit_and_history_patterns():
    assert COMMIT_LIKE.search("the model of 246f1c4") and COMMIT_LIKE.search("since e40b584,")
    assert not COMMIT_LIKE.search("1000000 deadbeef avhubert_base bf16 spm_unigram1000")
    assert not COMMIT_LIKE.search(URL.sub(" ", "see https://github.com/x/y/commit/246f1c4abc"))
    assert HISTORY.search("the targets of issue 15") and HISTORY.search("stop 31's code")
    assert not HISTORY.search("a stop token; 15 issues")
    assert HISTORY.search("see #82.") and not HISTORY.search("(RESULTS_LOG.md#2026-11-28-twice-the-data)")


def test_readme_keeps_the_fresh_machine_commands():
    readme = README.read_text(encoding="utf-8")
    for command in FRESH_MACHINE_COMMANDS:
        assert f"   {command}\n" in readme, command


def test_readme_links_exist():
    readme = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if not URL.match(target):
            assert (REPO / target).exists(), f"README links to a missing file: {target}"


# ----------------------------------------------------------------------------------------------- RESULTS.md
RECIPE_RESULTS = sorted((REPO / "recipes").rglob("RESULTS.md"))
SYNTHGRID = REPO / "recipes" / "synthgrid" / "avsr1"


def _first_table_line(text: str) -> int | None:
    """The line number (1-based) of the first markdown table (a header row followed by its ``|---`` rule)."""
    lines = text.splitlines()
    for i in range(len(lines) - 1):
        if lines[i].lstrip().startswith("|") and re.match(r"^\s*\|\s*:?-{3,}", lines[i + 1]):
            return i + 1
    return None


@pytest.mark.parametrize("path", RECIPE_RESULTS, ids=lambda p: str(p.relative_to(REPO)))
def test_each_recipe_results_show_their_tables_first(path):
    """As ESPnet's RESULTS.md: the current tables within the first 60 lines, not after a lab notebook."""
    line = _first_table_line(path.read_text(encoding="utf-8"))
    assert line is not None and line <= 60, f"{path.relative_to(REPO)}: first table at line {line}"


def test_recipe_results_are_found():
    assert SYNTHGRID / "RESULTS.md" in RECIPE_RESULTS


def _current_tables_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("current_tables", SYNTHGRID / "local" / "current_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthgrid_current_tables_are_those_of_its_results_json():
    """The marked blocks of the SynthGRID RESULTS.md are what local/current_tables.py writes from the
    results.json beside it: the figures at the top are the run's, and a new run replaces them by the tool."""
    import json

    tool = _current_tables_tool()
    text = (SYNTHGRID / "RESULTS.md").read_text(encoding="utf-8")
    rows = json.loads((SYNTHGRID / "results.json").read_text(encoding="utf-8"))
    assert tool.block(text, "current tables") == tool.current_tables(rows), (
        "RESULTS.md's current tables differ from results.json: run local/current_tables.py")
    # the details as the scoring stage wrote them (its columns may grow): each row's WER and errors by type
    sections = re.findall(r"^### (\S+)\n(.*?)(?=^### |\Z)", tool.block(text, "current details"), re.S | re.M)
    details = dict(sections)
    assert set(details) == {r["test_set"] for r in rows}
    for r in rows:
        snr = "-" if r["snr_db"] is None else f"{r['snr_db']:g}"
        line = (f"| {r['modality']} | {r['noise']} | {snr} | {r['wer']:.2f} | "
                f"{r['sub']} | {r['del']} | {r['ins']} |")
        assert line in details[r["test_set"]], (r["test_set"], line)
    assert "errors per slot" in tool.block(text, "corpus tables")
    assert tool.replace_block(text, "current tables", tool.current_tables(rows)) == text
    assert _first_table_line(text) < text.splitlines().index("<!-- END current tables -->")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_results_links_and_anchors_resolve():
    """Every relative link of the recipes' RESULTS*.md reaches a file, every ``#anchor`` a heading of it."""
    pages = sorted((REPO / "recipes").rglob("RESULTS*.md"))
    anchors = {p: {_slug(line.lstrip("#")) for line in p.read_text(encoding="utf-8").splitlines()
                   if line.startswith("#")} for p in pages}
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if URL.match(target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(REPO)} links to a missing file: {target}"
            if anchor and dest in anchors:
                assert anchor in anchors[dest], f"{page.relative_to(REPO)}: no heading for {target}"


def test_github_slugs():
    assert _slug(" 2026-11-25: Fusion: two views, an `audio_gate` (x 0.9)") == (
        "2026-11-25-fusion-two-views-an-audio_gate-x-09")
