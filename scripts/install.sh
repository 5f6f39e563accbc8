#!/usr/bin/env bash
# Install everything avsr needs on a fresh Debian machine into ./.venv (run from anywhere).
#   bash scripts/install.sh          # runtime: Debian packages (festival + voices) and the package
#   bash scripts/install.sh --video  # also mediapipe + scikit-image (raw face videos: LRS3, avsr transcribe)
#   bash scripts/install.sh --dev    # also the test tools (pytest, ruff, Selenium + Debian's chromium), the
#                                    # video and demo extras
# torch/torchaudio are pinned by constraints.txt (the versions CI uses); setup.cfg allows a range.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras=""
case "${1:-}" in
  --dev) extras="[dev]" ;;
  --video) extras="[video]" ;;
  "") ;;
  *) echo "usage: bash scripts/install.sh [--dev|--video]" >&2; exit 1 ;;
esac

# festival and its voices: the SynthGRID corpus speaks English with every festival voice Debian ships
# (avsr/corpora/synthgrid/voices.py maps the US English phones onto each voice's phone set). festvox-mr-nsk
# and festvox-te-nsk hold the same diphone database as festvox-hi-nsk and are not needed; the 8 kHz
# packages festvox-kallpc8k/kdlpc8k conflict with the 16 kHz ones (apt would remove those): narrowband
# speech comes from band limiting instead (avsr/corpora/synthgrid/augment.py). espeak-ng and flite are the
# other synthesisers of SynthGRID (avsr/corpora/synthgrid/engines.py; never their MBROLA voices).
debs=(festival espeak-ng flite festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts
  festvox-italp16k festvox-itapc16k festvox-czech-dita festvox-czech-krb festvox-czech-machac festvox-czech-ph
  festvox-suopuhe-lj festvox-suopuhe-mv festvox-ru festvox-ca-ona-hts festvox-hi-nsk)
# --dev: Debian's Chromium and its WebDriver, for the browser test of `avsr demo` (tests/test_demo.py drives
# them with Selenium; nothing downloads a browser)
if [ "$extras" = "[dev]" ]; then debs+=(chromium chromium-driver); fi
missing=()
for d in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q "install ok installed" || missing+=("$d")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install] apt-get install ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

py="${PYTHON:-python3}"
# torch with its CUDA libraries makes .venv about 7 GB (pip unpacks it in a temporary directory first): a full
# disk would otherwise end pip half way with "[Errno 28] No space left on device"
need_gib=9
if ! { [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; }; then
  free_kib="$(df -Pk "$root" | awk 'NR == 2 { print $4 }')"
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $(( need_gib * 1024 * 1024 )) ]; then
    echo "[install] $root: $(( free_kib / 1024 / 1024 )) GiB free, .venv needs about ${need_gib} GiB" \
         "(torch with its CUDA libraries); free some space and run this again" >&2
    exit 1
  fi
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q -c constraints.txt -e ".${extras}"
.venv/bin/python -c "import torch, torchaudio, av, sentencepiece; print('[install] torch', torch.__version__, '| torchaudio', torchaudio.__version__)"
