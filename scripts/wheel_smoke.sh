#!/usr/bin/env bash
# Wheel smoke test: build the wheel from this checkout, install it (not editable) into a FRESH virtual
# environment and run scripts/wheel_smoke.py with that environment's python from a temporary directory
# outside the source tree (what it checks: the docstring of wheel_smoke.py).
#
#   bash scripts/wheel_smoke.sh                 # dependencies: those of .venv (see below); ~1-2 min
#   bash scripts/wheel_smoke.sh --install-deps  # dependencies installed into the fresh environment
#   DEPS_VENV=/path/to/venv bash scripts/wheel_smoke.sh   # another environment than ./.venv
#   KEEP=1 bash scripts/wheel_smoke.sh          # keep the temporary directory (its path is printed)
#
# Dependencies. avsr itself is always installed from the wheel alone (pip install --no-deps, no editable
# install, nothing of the checkout on sys.path). Its dependencies (torch with its CUDA libraries: ~6 GB)
# are by default not installed a second time: a .pth file in the fresh environment appends the
# site-packages of .venv -- made by scripts/install.sh --dev with the versions pinned in constraints.txt --
# to sys.path. Python does not process the .pth files of a directory named in a .pth file, so .venv's
# editable avsr (a .pth import hook) stays inactive, and `pip check` then verifies that the wheel's
# requirements are met by what is visible. With --install-deps, pip installs the wheel with its
# dependencies from the registry under constraints.txt into the fresh environment instead (measured on
# 2 cores: 1 min 47 s and 5.9 GB for the install alone).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps_venv="${DEPS_VENV:-$root/.venv}"
install_deps=0
case "${1:-}" in
  --install-deps) install_deps=1 ;;
  "") ;;
  *) echo "usage: bash scripts/wheel_smoke.sh [--install-deps]" >&2; exit 1 ;;
esac
py="$deps_venv/bin/python"
if [ ! -x "$py" ]; then
  echo "[wheel-smoke] no python at $py: run scripts/install.sh --dev first (or set DEPS_VENV)" >&2
  exit 1
fi
t_start=$(date +%s)
stamp() { echo "[wheel-smoke] $1 ($(( $(date +%s) - t_start )) s)"; }

work="$(mktemp -d -t avsr-wheel-smoke-XXXXXX)"
if [ "${KEEP:-0}" = 1 ]; then
  echo "[wheel-smoke] keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP

# 1. the wheel, built from a copy of the checkout's files (tracked and untracked, not ignored), so that
#    nothing left in build/ or *.egg-info by an earlier build can slip into it
mkdir -p "$work/src" "$work/dist" "$work/run"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$work/src"
else
  (cd "$root" && tar --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' \
     --exclude='./recipes/*/avsr1/exp' --exclude='./recipes/*/avsr1/data' --exclude='./recipes/*/avsr1/dump' \
     --exclude='./recipes/*/avsr1/corpus' -cf - .) | tar -xf - -C "$work/src"
fi
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel="$(ls "$work"/dist/avsr-*.whl)"
stamp "built $(basename "$wheel")"

# 2. a fresh virtual environment (on .venv's base interpreter) with the wheel installed
vpy="$work/venv/bin/python"
if [ "$install_deps" = 1 ]; then
  "$py" -m venv "$work/venv"
  "$vpy" -m pip install -q -c "$root/constraints.txt" "$wheel"
  "$vpy" -m pip check
else
  # no pip of its own (its bundled setuptools would shadow .venv's): .venv's pip installs into it
  "$py" -m venv --without-pip "$work/venv"
  purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  purelib "$py" > "$(purelib "$vpy")/_avsr_smoke_deps.pth"
  "$py" -m pip --python "$vpy" install -q --no-deps "$wheel"
  "$py" -m pip --python "$vpy" check
fi
stamp "installed into the fresh environment $work/venv"

# 3. the checks, from a directory outside the source tree
(cd "$work/run" && "$vpy" -I "$root/scripts/wheel_smoke.py" --checkout "$root" --wheel "$wheel")
stamp "wheel smoke test passed"
