#!/usr/bin/env bash
# Prints the path of a Python interpreter that has the official CloudEvents SDK for Python
# (PyPI `cloudevents`, pinned), creating a venv for it when needed. The relay e2e test's
# receiver (tests/e2e/cloudevents_receiver.py) parses every event the webhook relay sends
# with it. The venv lives in $FLEETWATCH_TOOLS (default ~/.cache/fleetwatch-tools).
set -euo pipefail

version=2.2.0
tools="${FLEETWATCH_TOOLS:-$HOME/.cache/fleetwatch-tools}"
venv="$tools/cloudevents-$version"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c "import cloudevents, sys; sys.exit(cloudevents.__version__ != '$version')" 2>/dev/null; then
  echo "$py"; exit 0
fi
command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
python3 -m venv "$venv" >&2 || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv "$venv"; } >&2
"$venv/bin/pip" install -q --disable-pip-version-check "cloudevents==$version" >&2 \
  || { echo "cannot install cloudevents==$version from PyPI into $venv" >&2; exit 1; }
echo "$py"
