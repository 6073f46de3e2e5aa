#!/usr/bin/env bash
# Refreshes requirements/lock.txt: every package of the CPU install and the test extra,
# pinned to one version, resolved with pip-compile (pip-tools) in a new virtual
# environment for this machine's Python (the lock is for Linux x86_64, CPython 3.11).
#
#   bash requirements/lock.sh      # then run the test suite and commit the new lock
#
# setup.py keeps the loose lower bounds; the lock is what the README, CI and the
# default study install with `pip install -e ".[test]" -c requirements/lock.txt`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip pip-tools
out=requirements/lock.txt
{
  echo "# Locked versions of the CPU install and its test extra (Linux x86_64, CPython 3.11)."
  echo "# Refresh: bash requirements/lock.sh. Use: pip install -e \".[test]\" -c $out"
  echo "# torch is the 2.13.0 CPU build; '==2.13.0' also matches its '+cpu' local version."
  "$venv/bin/pip-compile" --quiet --extra test --strip-extras --no-header \
    --no-emit-find-links --no-emit-index-url --no-emit-trusted-host \
    --annotation-style=line --output-file=- setup.py \
    | sed -E 's/^(torch==[0-9.]+)\+cpu/\1/'
} > "$out.new"
mv "$out.new" "$out"
echo "wrote $out ($(grep -c '==' "$out") pins)"
