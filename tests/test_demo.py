"""``avsr demo``: the JSON endpoint (FastAPI's TestClient) and the page in a real headless browser.

The endpoint's transcripts are the Transcriber's own: each test compares the answer with
``Transcriber.__call__`` on the same file. The model is the tiny random one of tests/test_inference.py (its
``env`` fixture): the properties are equalities and errors, not accuracy.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason="needs the [demo] extra: pip install 'avsr[demo]'")

from fastapi.testclient import TestClient  # noqa: E402

from avsr.cli import SUBCOMMANDS  # noqa: E402
from avsr.cli import main as avsr_main  # noqa: E402
from avsr.demo.app import create_app  # noqa: E402
from avsr.demo.uploads import safe_filename  # noqa: E402
from avsr.inference import Transcriber  # noqa: E402
from avsr.models.asr import AVSRModel  # noqa: E402
from tests import test_inference  # noqa: E402
from tests.test_inference import CONFIG, DECODE  # noqa: E402

#: the module-scoped fixture of tests/test_inference.py: a tiny model in an experiment dir + 4 utterances
env = test_inference.env

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
needs_roi_stage = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None or importlib.util.find_spec("skimage") is None,
    reason="needs mediapipe and scikit-image (the [video] extra)")


@pytest.fixture(scope="module")
def demo(env, tmp_path_factory):
    """The tiny model's Transcriber (loaded from its experiment dir, as ``avsr demo`` loads it) and its app,
    whose temporary directory lies in a folder of the test's."""
    tr = Transcriber.from_pretrained(env["exp"], decode_config=DECODE)
    tmp = tmp_path_factory.mktemp("demo_tmp")
    return {"tr": tr, "app": create_app(tr, model_name="tiny", tmp_dir=tmp), "tmp": tmp}


@pytest.fixture
def client(demo):
    """A TestClient of the app; after each test, no request has left a file in the app's temporary
    directory."""
    client = TestClient(demo["app"])
    yield client
    root = demo["app"].state.tmp_root
    assert not root.exists() or list(root.iterdir()) == []


def _post(client, files: dict[str, Path | tuple[str, bytes]], **fields: str):
    parts = {name: (f.name, f.read_bytes()) if isinstance(f, Path) else f for name, f in files.items()}
    return client.post("/api/transcribe", files=parts, data=fields)


def _png(data_url: str) -> np.ndarray:
    from PIL import Image

    assert data_url.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


# --- the JSON endpoint --------------------------------------------------------------------------------


def test_an_audio_upload_gives_the_transcribers_transcript_with_word_timings(demo, env, client):
    wav = env["utts"][0][1]
    r = _post(client, {"audio": wav})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == {"text", "words", "modality", "info"}
    own = demo["tr"](audio=wav)
    assert answer["modality"] == "audio"
    assert answer["text"] == own.text
    assert answer["words"] == [w.to_dict() for w in own.words]
    assert all({"word", "start", "end"} <= set(w) and w["start"] <= w["end"] for w in answer["words"])
    assert answer["info"]["allowed"] == ["audio"]
    assert answer["info"]["duration_s"] == pytest.approx(own.duration_s)
    assert "roi" not in answer["info"] and "fusion" not in answer["info"]


def test_video_and_audio_give_every_modality_the_roi_track_and_the_fusion(demo, env, client):
    mp4, wav = env["utts"][1]
    r = _post(client, {"video": mp4, "audio": wav}, compare="1")
    assert r.status_code == 200, r.text
    answer, tr = r.json(), demo["tr"]
    info = answer["info"]
    assert answer["modality"] == "audiovisual" and info["allowed"] == ["audiovisual", "video", "audio"]
    assert answer["text"] == tr(video=mp4, audio=wav).text
    assert list(info["modalities"]) == ["audiovisual", "video", "audio"]
    for modality, entry in info["modalities"].items():
        own = tr(video=mp4 if modality != "audio" else None, audio=wav, modality=modality)
        assert (entry["modality"], entry["text"]) == (modality, own.text)
        assert entry["words"] == [w.to_dict() for w in own.words]
    roi = info["roi"]
    assert (roi["num_frames"], roi["size"], roi["fps"]) == (45, [96, 96], 25.0)
    strip = _png(roi["strip"])
    assert strip.shape == (96, 96 * 8) and strip.dtype == np.uint8
    assert roi["gif"].startswith("data:image/gif;base64,")
    fusion = info["fusion"]
    assert (fusion["video_weight"], fusion["audio_weight"], fusion["views"]) == (0.0, 0.0, {})
    assert "audio_gate" not in fusion  # the tiny model has no gates


def test_one_modality_is_decoded_unless_compare_is_asked_for(demo, env, client):
    mp4, wav = env["utts"][2]
    r = _post(client, {"video": mp4, "audio": wav}, modality="video")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["modality"] == "video" and "modalities" not in answer["info"]
    assert answer["text"] == demo["tr"](video=mp4, audio=wav, modality="video").text
    assert answer["info"]["roi"]["num_frames"] == 38


def test_the_gates_and_views_of_a_gated_model_are_shown(env, tmp_path):
    gated = {**CONFIG["encoder_conf"], "audio_gate": True, "video_gate": True}
    config = {**CONFIG, "vocab_size": env["tokenizer"].vocab_size, "encoder_conf": gated}
    torch.manual_seed(0)
    tr = Transcriber(AVSRModel.from_config(config), env["tokenizer"], {**DECODE, "video_weight": 0.5})
    mp4, wav = env["utts"][0]
    r = _post(TestClient(create_app(tr, tmp_dir=tmp_path)), {"video": mp4, "audio": wav})
    assert r.status_code == 200, r.text
    fusion = r.json()["info"]["fusion"]
    own = tr.transcribe_batch([{"video": mp4, "audio": wav}], views=True)[0]
    assert fusion["video_weight"] == 0.5
    assert fusion["views"] == {"video": own.views["video"].text}
    assert (fusion["audio_gate"], fusion["video_trust"]) == (own.info["audio_gate"], own.info["video_trust"])
    assert 0.0 < fusion["audio_gate"] < 1.0 and 0.0 < fusion["video_trust"] < 1.0
    assert "video_sync" not in fusion  # the soft gate: no decision

    rule = {"video_weight": 0.5, "video_sync_margin": 2.0, "video_sync_slope": 0.0}
    decided = Transcriber(tr.model, env["tokenizer"], {**DECODE, **rule})
    r = _post(TestClient(create_app(decided, tmp_dir=tmp_path)), {"video": mp4, "audio": wav})
    fusion = r.json()["info"]["fusion"]
    assert fusion["video_trust"] == 0.0  # a margin never reached: the audio alone
    assert fusion["video_sync_bar"] == 2.0 > fusion["video_sync"] and fusion["audio_ctc_confidence"] < 0
    assert "video_ctc_entropy" not in fusion  # no entropy bar set

    rule = {"video_weight": 0.5, "video_sync_margin": -2.0, "video_max_entropy": 0.0}
    decided = Transcriber(tr.model, env["tokenizer"], {**DECODE, **rule})
    r = _post(TestClient(create_app(decided, tmp_dir=tmp_path)), {"video": mp4, "audio": wav})
    fusion = r.json()["info"]["fusion"]
    assert fusion["video_trust"] == 0.0  # in sync by any margin, but no lips are read that surely
    assert fusion["video_entropy_bar"] == 0.0 < fusion["video_ctc_entropy"]


@needs_roi_stage
def test_a_raw_face_video_goes_through_the_roi_stage_once_and_gives_the_transcribers_words(demo, env, client):
    from avsr.data.face_video import write_face_utterance

    mp4, wav = env["utts"][1]
    face = env["root"] / "face talking.mp4"
    if not face.exists():
        write_face_utterance(mp4, wav, face, seed=1)
    r = _post(client, {"video": face}, compare="1")
    assert r.status_code == 200, r.text
    info, tr = r.json()["info"], demo["tr"]
    assert info["frames_without_face"] == 0 and info["roi"]["size"] == [96, 96]
    for modality, entry in info["modalities"].items():
        own = tr(video=face if modality != "audio" else None, audio=face, modality=modality)
        assert entry["text"] == own.text, modality


@needs_roi_stage
def test_a_video_without_a_face_is_transcribed_from_its_sound_and_says_why(demo, env, client):
    from avsr.data.media import read_wav, write_av_video

    wav = env["utts"][0][1]
    blank = env["root"] / "wall.mp4"  # a grey wall, with the first utterance's sound
    write_av_video(blank, np.full((30, 128, 128, 3), 120, dtype=np.uint8), read_wav(wav))
    r = _post(client, {"video": blank}, compare="1")
    assert r.status_code == 200, r.text
    answer = r.json()
    info = answer["info"]
    assert answer["modality"] == "audio" and "video_fallback" in info  # the Transcriber's fallback
    assert answer["text"] == demo["tr"](video=blank, audio=blank).text
    error = info["modalities"]["video"]["error"]
    assert "wall.mp4" in error and "avsr_demo_" not in error
    assert "roi" not in info and "fusion" not in info


def test_an_upload_over_the_limit_is_413(demo, env, tmp_path):
    app = create_app(demo["tr"], max_upload_mb=0.01, tmp_dir=tmp_path)  # 10 KiB; a 45-frame wav is 58 KB
    client = TestClient(app)
    r = _post(client, {"audio": env["utts"][1][1]})
    assert r.status_code == 413
    assert "upload too large: the limit is 0.01 MB" in r.json()["error"]
    # without a Content-Length (a chunked body), the limit holds while the body arrives
    chunks = (b"--b\r\nContent-Disposition: form-data; name=\"audio\"; filename=\"x.wav\"\r\n\r\n",
              *[b"\0" * 4096] * 4, b"\r\n--b--\r\n")
    r = client.post("/api/transcribe", content=iter(chunks),
                    headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413
    assert list(app.state.tmp_root.iterdir()) == []


@pytest.mark.parametrize("files, fields, status, message", [
    ({"audio": ("garbage.wav", b"RIFF" + bytes(range(256)) * 8)}, {}, 400,
     "garbage.wav: cannot read this file"),
    ({"video": ("empty.mp4", b"")}, {}, 400, "empty.mp4"),
    ({}, {"modality": "audio"}, 400, "nothing to transcribe"),
    ("wav", {"modality": "video"}, 400, "modality 'video' needs video, but the upload has audio only"),
    ("wav", {"modality": "lips"}, 400, "modality must be one of ['audio', 'video', 'audiovisual'], got"),
    ("wav", {"speaker": "me"}, 400, "unknown field 'speaker'"),
])
def test_bad_input_is_400_with_one_line(env, client, files, fields, status, message):
    files = {"audio": env["utts"][0][1]} if files == "wav" else files
    r = _post(client, files, **fields) if files else client.post(
        "/api/transcribe", files={"video": ("", b"")}, data=fields)  # a file input left empty
    assert r.status_code == status
    error = r.json()["error"]
    assert message in error and "\n" not in error
    assert "avsr_demo_" not in error  # the temporary paths are replaced by the uploaded file names


def test_a_body_that_is_no_form_is_400(client):
    r = client.post("/api/transcribe", json={"audio": "talk.wav"})
    assert r.status_code == 400 and "expected multipart/form-data" in r.json()["error"]


def test_the_temporary_directory_is_removed_at_shutdown(demo, env, tmp_path):
    app = create_app(demo["tr"], tmp_dir=tmp_path)
    with TestClient(app) as client:
        assert _post(client, {"audio": env["utts"][3][1]}).status_code == 200
        assert app.state.tmp_root.is_dir() and list(app.state.tmp_root.iterdir()) == []
    assert not app.state.tmp_root.exists() and list(tmp_path.iterdir()) == []


def test_info_and_the_page_are_served(client):
    info = client.get("/api/info").json()
    assert info["model"] == "tiny" and info["max_upload_mb"] == 50.0
    assert info["modalities"] == ["audiovisual", "video", "audio"]
    page = client.get("/")
    assert page.status_code == 200 and 'id="transcribe"' in page.text
    assert client.get("/static/app.js").status_code == 200


def test_safe_filename_keeps_a_base_name():
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("C:\\Users\\me\\my talk (1).mp4") == "my_talk__1_.mp4"
    assert safe_filename(".hidden") == "hidden" and safe_filename("") == "upload"


def test_the_cli_serves_the_checkpoint_on_localhost(env, tmp_path, monkeypatch, capsys):
    import uvicorn
    import yaml

    assert SUBCOMMANDS["demo"][0] == "avsr.bin.demo"
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    decode = tmp_path / "decode.yaml"
    decode.write_text(yaml.safe_dump(DECODE))
    assert avsr_main(["demo", "--checkpoint", str(env["exp"]), "--decode-config", str(decode),
                      "--max-upload-mb", "5", "--port", "8123"]) == 0
    assert (served["host"], served["port"]) == ("127.0.0.1", 8123)
    info = TestClient(served["app"]).get("/api/info").json()
    assert (info["model"], info["max_upload_mb"]) == (str(env["exp"]), 5.0)
    assert avsr_main(["demo", "--checkpoint", str(env["exp"]), "--max-upload-mb", "0"]) == 2
    assert "--max-upload-mb must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("option, browser", [("--dev", True), ("", False)])
def test_install_sh_apt_gets_chromium_for_the_browser_test_with_dev_only(tmp_path, option, browser):
    """scripts/install.sh --dev asks apt-get for Debian's chromium and chromium-driver (no other option does);
    a fake apt-get records the packages and stops the script."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")  # nothing installed
    log = tmp_path / "apt.log"
    (fake / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = install ] && exit 3\nexit 0\n')
    (fake / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "install.sh"), *([option] if option else [])],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    installed = log.read_text().splitlines()[-1].split()
    assert "festival" in installed
    assert ({"chromium", "chromium-driver"} <= set(installed)) == browser


# --- the page in a headless browser -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(demo):
    """The demo app served by uvicorn in a thread, on a free port of 127.0.0.1; its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(demo["app"], log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium driven by Selenium, with Debian's chromium and chromedriver (Selenium Manager is not
    used: it would download a browser), fake camera and microphone, and a fresh profile."""
    if not CHROMIUM.exists():
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (Debian's chromium, chromium-driver: "
                    "scripts/install.sh --dev installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1300",
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait_done(driver, timeout: float = 120.0) -> str:
    """Wait until the page's status leaves 'busy'; its state ('done', 'error', ...)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    status = driver.find_element(By.ID, "status")
    WebDriverWait(driver, timeout).until(
        lambda d: status.get_attribute("data-state") not in ("idle", "busy", "recording"))
    return status.get_attribute("data-state")


def test_the_page_uploads_a_file_and_shows_the_transcribers_transcript(demo, env, browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    mp4, wav = env["utts"][1]
    browser.get(server + "/")
    browser.find_element(By.ID, "video-file").send_keys(str(mp4))
    browser.find_element(By.ID, "audio-file").send_keys(str(wav))
    browser.find_element(By.ID, "transcribe").click()
    state = _wait_done(browser)
    status = browser.find_element(By.ID, "status").text
    browser.save_screenshot(str(tmp_path / "demo.png"))
    assert state == "done", status
    tr = demo["tr"]
    shown = browser.find_element(By.ID, "transcript").get_attribute("textContent")
    assert shown == tr(video=mp4, audio=wav).text
    rows = browser.find_elements(By.CSS_SELECTOR, "#modalities tbody tr")
    texts = {row.get_attribute("data-modality"): row.find_element(By.CLASS_NAME, "mod-text").text
             for row in rows}
    assert texts["audio"] == (tr(audio=wav).text or "(no words)")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#words .word")) == len(tr(video=mp4, audio=wav).words)
    assert browser.find_element(By.ID, "roi-strip").get_attribute("naturalWidth") == str(96 * 8)
    assert browser.find_element(By.ID, "roi-card").is_displayed()


def test_the_page_records_the_microphone_and_transcribes_it(browser, server):
    """MediaRecorder's webm/opus from Chromium's fake microphone goes through the endpoint (audio only)."""
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    browser.find_element(By.ID, "tab-record-button").click()
    browser.find_element(By.ID, "rec-camera").click()  # microphone only
    browser.find_element(By.ID, "rec-start").click()
    time.sleep(1.5)
    browser.find_element(By.ID, "rec-stop").click()
    assert _wait_done(browser, 20) == "ready", browser.find_element(By.ID, "status").text
    browser.find_element(By.ID, "transcribe").click()
    assert _wait_done(browser) == "done", browser.find_element(By.ID, "status").text
    assert browser.find_element(By.ID, "result-modality").text == "audio only"
