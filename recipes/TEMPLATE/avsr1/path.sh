# Sourced by every recipe's run.sh: put the repository's virtual environment first on PATH.
avsr_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
if [ -x "${avsr_root}/.venv/bin/python" ]; then
  export PATH="${avsr_root}/.venv/bin:${PATH}"
fi
export PYTHONUNBUFFERED=1
python=${python:-python3}
