#!/usr/bin/env bash
# Make a separate virtual environment with a released ESPnet and this package, for avsr.espnet
# (the ESPnet encoder wrapper, its entry points, recipes/synthgrid/asr1_espnet and tests/test_espnet*.py).
#   bash scripts/install_espnet.sh              # -> ./.venv-espnet (about 6 minutes on 2 CPU cores)
#   VENV=/path/to/venv bash scripts/install_espnet.sh
#
# Versions and why (checked 2026-11 on Python 3.11):
# - ESPnet releases from 202609 on (202609, 202610, 202611) require Python >= 3.12. With Python 3.11 (Debian
#   bookworm) the newest ESPnet that installs is 202511; this script takes 202611 when the Python it is given
#   (PYTHON=python3.12) is >= 3.12, otherwise 202511. ESPNET_VERSION=... overrides either.
# - espnet 202511 pins setuptools<74 while torch 2.14.1 needs setuptools>=77.0.3, so `pip install espnet==202511
#   torch==2.14.1` cannot be resolved. espnet 202511 is installed with --no-deps and its other requirements
#   (its wheel's Requires-Dist lines less setuptools) next to the project's torch/torchaudio pins
#   (constraints.txt); ESPnet's ASR code does not import setuptools. espnet 202611 allows setuptools>=77 and
#   torch 2.14, so it installs with its own requirements.
# - Neither release lists a requirement given as a direct URL (no `name @ url` among its Requires-Dist), so the
#   pip bundled with the venv works; PIP_VERSION (default 24.3.1, the version this was checked with) is pinned
#   so that the install is repeatable across pip releases.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${VENV:-.venv-espnet}"
py="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  espnet_version="${ESPNET_VERSION:-202611}"
else
  espnet_version="${ESPNET_VERSION:-202511}"
fi
echo "[install_espnet] $venv: espnet==$espnet_version, $("$venv/bin/python" --version)"
pip=("$venv/bin/python" -m pip install -q -c constraints.txt)
"$venv/bin/python" -m pip install -q "pip==${PIP_VERSION:-24.3.1}"
# 1. the project's torch and torchaudio
"${pip[@]}" torch torchaudio
if [ "$espnet_version" -ge 202609 ]; then
  "${pip[@]}" "espnet==${espnet_version}"
else
# 2. espnet itself, without its setuptools<74 pin
  "${pip[@]}" --no-deps "espnet==${espnet_version}"
# 3. espnet's other requirements (espnet 202511's Requires-Dist without setuptools and torch)
  "${pip[@]}" packaging "configargparse>=1.2.1" typeguard humanfriendly "scipy>=1.4.1" filelock \
  "librosa>=0.10.2" "jamo==0.4.1" "PyYAML>=5.1.2" "soundfile>=0.10.2" "h5py>=2.10.0" "kaldiio>=2.18.0" \
  torch_complex "nltk>=3.4.5" "numpy>=2.0.0" protobuf hydra-core opt-einsum lightning "sentencepiece==0.2.0" \
  "pyworld>=0.3.4" "pypinyin<=0.44.0" espnet_tts_frontend ci_sdr "fast-bss-eval==0.1.3" \
  "asteroid_filterbanks==0.4.0" editdistance "importlib-metadata<5.0"
fi
# 4. this package (editable, with its own requirements, e.g. tensorboard) and the test tools
"${pip[@]}" -e . pytest
"$venv/bin/python" - <<'EOF'
import espnet, torch, torchaudio
import espnet2.bin.asr_inference  # noqa: F401
import espnet2.bin.asr_train  # noqa: F401
import avsr.espnet
print("[install_espnet] espnet", espnet.__version__, "| torch", torch.__version__,
      "| torchaudio", torchaudio.__version__, "| avsr.espnet", avsr.espnet.__file__)
EOF
