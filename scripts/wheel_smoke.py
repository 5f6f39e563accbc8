"""Smoke test of an installed avsr wheel; run by ``scripts/wheel_smoke.sh`` with the fresh virtual
environment's interpreter, from a temporary directory outside the source tree.

Checks, in order (each prints one ``[smoke]`` line with its time):

1. ``avsr`` is imported from the fresh environment's site-packages, from a regular (not editable) install
   of the wheel, not from the checkout, and ``avsr.__version__`` is the wheel's version;
2. the wheel holds every module and every package-data file of the checkout (``avsr/conf/*/*.yaml``,
   ``avsr/data/assets/*``, ``avsr/demo/static/*``) and nothing else, the data files are importable resources,
   and its ``.dist-info`` holds the checkout's ``LICENSE``;
3. every module of the package imports (walked with :mod:`pkgutil`); modules that need an optional extra
   which is not installed (MediaPipe, scikit-image, FastAPI) are skipped and named;
4. ``--help`` of every console script of setup.cfg (each in a process of its own) and of every
   ``avsr <subcommand>`` exits with 0;
5. each encoder factory builds an encoder that runs a forward pass on a random audio-visual batch (finite
   output of the right shape; LARGE: parameter count and a 1 x 4-frame batch);
6. every shipped configuration loads by name (models and training configurations built on the meta device);
7. end to end: ``AVSRModel.from_yaml("avsr_synthgrid_cpu")`` with random weights and a tiny sentencepiece
   model is saved as an avsr checkpoint, and the ``avsr-decode`` console script decodes a one-utterance
   Kaldi data dir (16 kHz wav, 96x96 25 fps gray mp4) audio-visually with ``--decode-config default``;
8. the transcription API (:func:`check_transcriber`);
9. the shipped model from Python, ``avsr transcribe`` and the demo's endpoint (:func:`check_shipped_model`).

Usage: ``python wheel_smoke.py --checkout REPO --wheel DIST/avsr-*.whl`` (exit status 0 when all pass;
an AssertionError names the failed check).
"""

from __future__ import annotations

import argparse
import configparser
import dataclasses
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import pkgutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: top-level modules of optional extras -> the extra that installs them (setup.cfg extras_require)
OPTIONAL_MODULES = {"mediapipe": "pip install 'avsr[video]'", "skimage": "pip install 'avsr[video]'",
                    "espnet": "the ESPnet environment, scripts/install_espnet.sh",
                    "fastapi": "pip install 'avsr[demo]'", "uvicorn": "pip install 'avsr[demo]'",
                    "python_multipart": "pip install 'avsr[demo]'"}
#: a GRID-like sentence, the transcript of the decoded utterance
SENTENCE = "BIN BLUE AT F TWO NOW"


def log(msg: str) -> None:
    print(f"[smoke] {msg}", flush=True)


def timed(name: str):
    """Decorator: run the check, print its name and wall time."""

    def wrap(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            log(f"ok  {name} ({time.perf_counter() - t0:.1f} s)")
            return out

        return run

    return wrap


def under(path: Path, root: Path) -> bool:
    """Whether ``path`` lies inside ``root`` (both resolved)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def package_data_files(checkout: Path) -> list[str]:
    """Paths (relative to ``avsr/``) of the checkout's package-data files: everything under ``avsr/conf``,
    ``avsr/data/assets`` and ``avsr/demo/static`` (the demo's page), and the shipped models' files
    (``avsr/pretrained/<name>/``)."""
    pkg = checkout / "avsr"
    return sorted(
        p.relative_to(pkg).as_posix()
        for d in ("conf", "data/assets", "demo/static", "pretrained")
        for p in (pkg / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"
    )


@timed("1 avsr is the wheel installed in the fresh environment")
def check_location(checkout: Path) -> None:
    import avsr

    purelib = Path(sysconfig.get_paths()["purelib"])
    assert under(avsr.__file__, purelib), f"avsr imported from {avsr.__file__}, not from {purelib}"
    assert not under(avsr.__file__, checkout), f"avsr imported from the checkout: {avsr.__file__}"
    assert not under(Path.cwd(), checkout), f"the smoke test must run outside the checkout, cwd {Path.cwd()}"
    dist = importlib.metadata.distribution("avsr")
    assert under(dist.locate_file("avsr"), purelib), f"avsr metadata at {dist.locate_file('')}"
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    assert not direct.get("dir_info", {}).get("editable"), f"avsr is an editable install: {direct}"
    assert direct.get("url", "").endswith(".whl"), f"avsr was not installed from a wheel: {direct}"
    assert avsr.__version__ == dist.version, f"avsr.__version__ {avsr.__version__} != wheel {dist.version}"
    log(f"    avsr {dist.version} from {Path(avsr.__file__).parent}")


@timed("2 wheel contents and package-data resources")
def check_wheel(checkout: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    pkg = checkout / "avsr"
    modules = {p.relative_to(checkout).as_posix() for p in pkg.rglob("*.py") if "__pycache__" not in p.parts}
    data = {f"avsr/{rel}" for rel in package_data_files(checkout)}
    assert any(n.startswith("avsr/train/") for n in modules) and any(n.endswith(".yaml") for n in data)
    missing = sorted((modules | data) - names)
    assert not missing, f"{wheel.name} lacks {missing}"
    extra = sorted(n for n in names - modules - data if not n.startswith("avsr-") or ".dist-info/" not in n)
    assert not extra, f"{wheel.name} holds files that are neither modules nor package data: {extra}"
    licence = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licence, f"{wheel.name} lacks the LICENSE file (setup.cfg: license_files)"
    with zipfile.ZipFile(wheel) as zf:
        same = zf.read(licence[0]) == (checkout / "LICENSE").read_bytes()
    assert same, f"{licence[0]} differs from the checkout's LICENSE"
    root = importlib.resources.files("avsr")
    for rel in package_data_files(checkout):
        resource = root.joinpath(*rel.split("/"))
        assert resource.is_file(), f"package data avsr/{rel} is not an importable resource"
        assert resource.read_bytes() == (pkg / rel).read_bytes(), f"avsr/{rel} differs from the checkout"
    n_assets = sum(1 for n in data if not n.startswith("avsr/conf/"))  # data/assets, the demo's page
    log(f"    {wheel.name}: {len(names)} files = {len(modules)} modules, {len(data) - n_assets} configs, "
        f"{n_assets} assets, {len(names) - len(modules) - len(data)} metadata files")


@timed("3 every module imports")
def check_imports() -> None:
    import avsr

    names = ["avsr"]
    failed_walk: list[str] = []
    for info in pkgutil.walk_packages(avsr.__path__, "avsr.", onerror=failed_walk.append):
        names.append(info.name)
    assert not failed_walk, f"packages that fail to import: {failed_walk}"
    skipped = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top in OPTIONAL_MODULES and importlib.util.find_spec(top) is None:
                skipped.append(f"{name} (needs {top}: {OPTIONAL_MODULES[top]})")
                continue
            raise
    assert "avsr.train.trainer" in names and "avsr.corpora.synthgrid.generate" in names, names
    log(f"    {len(names) - len(skipped)} modules imported; skipped: {', '.join(skipped) or 'none'}")
    missing_extras = [m for m in OPTIONAL_MODULES if importlib.util.find_spec(m) is None]
    if missing_extras:
        log(f"    optional modules not installed: {', '.join(missing_extras)}")


def console_scripts(checkout: Path) -> list[str]:
    """Console script names declared in the checkout's setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(checkout / "setup.cfg", encoding="utf-8")
    lines = cfg["options.entry_points"]["console_scripts"].splitlines()
    return [line.split("=")[0].strip() for line in lines if line.strip()]


@timed("4 --help of every console script and avsr subcommand")
def check_help(checkout: Path, jobs: int) -> None:
    """Every console script of setup.cfg runs ``--help`` in a process of its own (the installed entry-point
    wrapper); ``avsr <subcommand> --help`` runs in this process through the ``avsr`` command's ``main``
    (the same dispatch; one subcommand also as a process), to save ~2 s of torch import per subcommand."""
    import contextlib
    import io

    from avsr.cli import SUBCOMMANDS
    from avsr.cli import main as avsr_main

    bindir = Path(sys.executable).parent
    declared = console_scripts(checkout)
    installed = {ep.name for ep in importlib.metadata.distribution("avsr").entry_points
                 if ep.group == "console_scripts"}
    assert set(declared) == installed, f"setup.cfg {sorted(declared)} vs wheel {sorted(installed)}"
    commands = [[str(bindir / name), "--help"] for name in declared]
    commands.append([str(bindir / "avsr"), "decode", "--help"])
    for cmd in commands:
        assert Path(cmd[0]).is_file(), f"console script {cmd[0]} not installed"

    def run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
        return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for cmd, proc in pool.map(run, commands):
            shown = " ".join([Path(cmd[0]).name, *cmd[1:]])
            assert proc.returncode == 0, f"{shown}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
            assert "usage" in proc.stdout.lower(), f"{shown} printed no usage:\n{proc.stdout[:500]}"
    for sub in SUBCOMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                status = avsr_main([sub, "--help"])
            except SystemExit as e:  # argparse's --help
                status = e.code
        assert status in (0, None), f"avsr {sub} --help: exit {status}"
        assert "usage" in out.getvalue().lower(), f"avsr {sub} --help printed no usage"
    log(f"    {len(declared)} console scripts, {len(SUBCOMMANDS)} avsr subcommands")


@timed("5 encoder factories: forward passes on random audio-visual batches")
def check_factories() -> None:
    import torch

    import avsr

    torch.manual_seed(0)
    cases = [  # factory, output size, batch, frames, parameter count range (the paper: 103M / 325M)
        ("avhubert_synthgrid_cpu", 192, 2, 12, (1e6, 5e6)),
        ("avhubert_base", 768, 2, 6, (102e6, 104e6)),
        ("avhubert_large", 1024, 1, 4, (324e6, 326e6)),
    ]
    for name, dim, b, t, (low, high) in cases:
        t0 = time.perf_counter()
        enc = getattr(avsr, name)().eval()
        n = sum(p.numel() for p in enc.parameters())
        assert isinstance(enc, avsr.AVHubertEncoder) and low < n < high, (name, n)
        lengths = torch.tensor([t] + [t - 2] * (b - 1))
        xs = {"audio": torch.randn(b, 104, t), "video": torch.randn(b, 1, t, 88, 88)}
        with torch.no_grad():
            hidden, olens, _ = enc(xs, lengths)
        assert hidden.shape == (b, t, dim), (name, tuple(hidden.shape))
        assert torch.isfinite(hidden).all(), f"{name}: non-finite output"
        assert olens.tolist() == lengths.tolist(), (name, olens)
        log(f"    {name}(): {n / 1e6:.1f}M parameters, ({b}, {t}) frames -> {tuple(hidden.shape)} "
            f"in {time.perf_counter() - t0:.1f} s")
        del enc


@timed("6 every shipped configuration loads by name")
def check_configs() -> None:
    import torch

    from avsr.config import CONFIG_KINDS, TRAIN_KINDS, config_path, load_yaml, shipped_configs
    from avsr.decode.config import DecodeConfig
    from avsr.encoder import AVHubertEncoder
    from avsr.models.asr import AVSRModel
    from avsr.models.pretrain import AVHubertPretrainModel
    from avsr.train.config import load_experiment_config

    purelib = Path(sysconfig.get_paths()["purelib"])
    counts = {}
    for kind in CONFIG_KINDS:
        names = shipped_configs(kind)
        assert names, f"no shipped {kind} configs"
        counts[kind] = len(names)
        for name in names:
            path = config_path(name, kind if kind in ("model", "decode") else TRAIN_KINDS)
            assert under(path, purelib) and path.parent.name == kind, (name, path)
            with torch.device("meta"):
                if kind == "decode":
                    DecodeConfig.from_yaml(name)
                elif kind == "model":
                    if "decoder_conf" in load_yaml(path):
                        AVSRModel.from_yaml(name, vocab_size=10)
                    else:
                        AVHubertEncoder.from_yaml(name)
                else:
                    model = load_experiment_config(name).model
                    if model.pretraining:
                        AVHubertPretrainModel.from_config(dataclasses.replace(model, num_classes=[10]), name)
                    else:
                        if model.model_conf.phone_ctc_weight > 0:  # the trainer sets it from the lexicon
                            from avsr.corpora.synthgrid.voices import english_lexicon

                            phones = english_lexicon().num_classes
                            model = dataclasses.replace(model, model_conf=dataclasses.replace(
                                model.model_conf, phone_vocab_size=phones))
                        AVSRModel.from_config(dataclasses.replace(model, vocab_size=10), name)
    assert DecodeConfig.from_yaml("avhubert_s2s").search == "fairseq"
    log("    " + ", ".join(f"{k}: {n}" for k, n in counts.items()))


@timed("7 avsr-decode on a one-utterance data dir with a packaged-config model")
def check_decode(work: Path) -> tuple[Path, Path, Path, Path]:
    import numpy as np
    import torch

    from avsr.checkpoint import save_atomic
    from avsr.config import config_path, load_yaml
    from avsr.corpora.synthgrid.grammar import sample_sentence, transcript
    from avsr.data.datadir import Utterance, read_kaldi_map, write_datadir
    from avsr.data.media import write_video, write_wav
    from avsr.data.tokenizer import Tokenizer, train_sentencepiece
    from avsr.models.asr import AVSRModel

    rng = np.random.default_rng(0)
    texts = [SENTENCE] + [transcript(sample_sentence(rng)) for _ in range(60)]
    tokenizer = Tokenizer(train_sentencepiece(texts, work / "bpe", vocab_size=40))
    torch.manual_seed(0)
    model = AVSRModel.from_yaml("avsr_synthgrid_cpu", vocab_size=tokenizer.vocab_size)
    model_config = {**load_yaml(config_path("avsr_synthgrid_cpu", "model")), "vocab_size": model.vocab_size}
    assert AVSRModel.from_config(model_config).state_dict().keys() == model.state_dict().keys()
    checkpoint = work / "model.pt"
    save_atomic({"model": model.state_dict(), "model_config": model_config}, checkpoint)

    frames, rate = 30, 16000  # 1.2 s: 30 video frames at 25 fps, 640 audio samples per frame
    t = np.arange(frames * 640) / rate
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) * np.hanning(t.size) + 0.01 * rng.standard_normal(t.size)
    yy, xx = np.mgrid[:96, :96]
    video = np.stack([128 + 60 * np.sin((xx + 3 * i) / 9.0) * np.cos(yy / 13.0) for i in range(frames)])
    media = work / "media"
    media.mkdir()
    write_wav(media / "spk1_utt1.wav", wav.astype(np.float32), rate)
    write_video(media / "spk1_utt1.mp4", video.astype(np.uint8), fps=25)
    data = work / "data" / "smoke"
    write_datadir(data, [Utterance("spk1_utt1", "spk1", wav=str(media / "spk1_utt1.wav"),
                                   video=str(media / "spk1_utt1.mp4"), text=SENTENCE, num_frames=frames)])

    cmd = [str(Path(sys.executable).parent / "avsr-decode"), "--checkpoint", str(checkpoint),
           "--bpemodel", str(work / "bpe.model"), "--data", str(data), "--decode-config", "default",
           "--modalities", "audiovisual", "--out", str(work / "decode")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=work)
    assert proc.returncode == 0, f"avsr-decode: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    out = work / "decode" / "smoke" / "audiovisual" / "clean"
    hyps = read_kaldi_map(out / "hyp", allow_empty_value=True)
    refs = read_kaldi_map(out / "ref")
    assert list(hyps) == ["spk1_utt1"] and refs == {"spk1_utt1": SENTENCE}, (hyps, refs)
    log(f"    hyp of the random-weight model: {hyps['spk1_utt1'][:60]!r}")
    return checkpoint, work / "bpe.model", media / "spk1_utt1.wav", media / "spk1_utt1.mp4"


@timed("8 transcription API")
def check_transcriber(checkpoint: Path, bpemodel: Path, wav: Path, video: Path) -> None:
    """The transcription API on the checkpoint of check 7: ``avsr.Transcriber`` on the files and on arrays
    (random weights: any text is fine; both calls must agree), and ``avsr transcribe`` on the ROI video."""
    import avsr
    from avsr.data.media import read_video, read_wav

    transcriber = avsr.Transcriber.from_pretrained(checkpoint, bpemodel=bpemodel, decode_config="default")
    by_path = transcriber(video=video, audio=wav)
    by_array = transcriber(video=read_video(video).numpy(), audio=read_wav(wav))
    assert isinstance(by_path, avsr.Transcript) and by_path.modality == "audiovisual", by_path
    assert by_path.tokens == by_array.tokens and by_path.num_frames == 30, (by_path, by_array)
    assert by_path.words is not None  # the CTC head gives word timings
    cmd = [str(Path(sys.executable).parent / "avsr"), "transcribe", str(video), "--checkpoint",
           str(checkpoint), "--bpemodel", str(bpemodel), "--modality", "video"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=checkpoint.parent)
    assert proc.returncode == 0, f"avsr transcribe: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert proc.stdout.startswith(f"{video}\t"), proc.stdout
    log(f"    Transcriber and avsr transcribe: {by_path.text[:60]!r}")


@timed("9 the shipped model: Transcriber, avsr transcribe and avsr demo without a checkpoint")
def check_shipped_model(work: Path) -> None:
    """The model in the wheel (``avsr/pretrained/synthgrid``) reads its example utterance right: by name from
    Python, from ``avsr transcribe`` without ``--checkpoint`` (the wav alone; the ROI video paired with it by
    ``--audio``) and from the demo's ``POST /api/transcribe`` (with the ``[demo]`` extra)."""
    import avsr
    import avsr.pretrained

    folder = avsr.pretrained.ROOT / avsr.pretrained.DEFAULT_MODEL
    wav, mp4 = folder / "example.wav", folder / "example.mp4"
    expected = (folder / "example.txt").read_text().strip()
    transcriber = avsr.Transcriber.from_pretrained("synthgrid")
    assert transcriber(audio=wav).text == expected, transcriber(audio=wav)
    assert transcriber(video=mp4, audio=wav).text == expected
    tool = str(Path(sys.executable).parent / "avsr")
    for args in ([str(wav)], [str(mp4), "--audio", str(wav)]):
        proc = subprocess.run([tool, "transcribe", *args], capture_output=True, text=True, timeout=600,
                              cwd=work)
        assert proc.returncode == 0, f"avsr transcribe {args}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert proc.stdout.strip().endswith(f"\t{expected}"), proc.stdout
    try:
        from fastapi.testclient import TestClient
    except ImportError:
        log("    no [demo] extra here: the demo's endpoint is not checked")
        return
    from avsr.demo.app import create_app

    client = TestClient(create_app(transcriber, model_name="synthgrid"))
    with open(wav, "rb") as f:
        answer = client.post("/api/transcribe", files={"audio": ("example.wav", f, "audio/wav")})
    assert answer.status_code == 200 and answer.json()["text"] == expected, answer.text
    log(f"    {expected!r} from Transcriber, avsr transcribe (wav; mp4 --audio wav) and /api/transcribe")


def main(argv: list[str] | None = None) -> int:
    """Run every check; exit status 0 when all pass."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", required=True, type=Path, help="the source tree the wheel was built from")
    p.add_argument("--wheel", required=True, type=Path, help="the installed wheel file")
    p.add_argument("--jobs", type=int, default=2, help="parallel --help processes")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    checkout = args.checkout.resolve()
    check_location(checkout)
    check_wheel(checkout, args.wheel)
    check_imports()
    check_help(checkout, args.jobs)
    check_factories()
    check_configs()
    with tempfile.TemporaryDirectory(prefix="avsr-smoke-") as tmp:
        paths = check_decode(Path(tmp))
        check_transcriber(*paths)
        check_shipped_model(Path(tmp))
    log(f"all checks passed in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
