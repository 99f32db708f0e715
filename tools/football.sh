#!/usr/bin/env bash
# `make football`: Google Research Football in the project's .venv, built once per machine.
#
# gfootball 2.10.2 has no wheel on PyPI: it is a C++ game (SDL2, Boost.Python, OpenGL) built from its source
# package. The first run installs Debian's build packages and builds a wheel (about 8 minutes on 2 cores)
# into a cache folder outside the repository, keyed by Python version and platform (the wheel is tied to
# this OS's Boost and SDL); later runs install from that wheel in seconds. Override the cache folder with
# RLQ_CACHE (default ~/.cache/rlq).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
VERSION=2.10.2
KEY=$("$PY" -c 'import sys, sysconfig; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{sysconfig.get_platform()}")')
CACHE=${RLQ_CACHE:-$HOME/.cache/rlq}/football/$KEY
DEBS="libsdl2-dev libsdl2-image-dev libsdl2-ttf-dev libsdl2-gfx-dev libboost-python-dev libboost-thread-dev \
libboost-system-dev libboost-filesystem-dev cmake g++"

source "$(dirname "${BASH_SOURCE[0]}")/apt_missing.sh"
# shellcheck disable=SC2086
install_missing football $DEBS

wheel=$(ls "$CACHE"/gfootball-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "football: building gfootball $VERSION once into $CACHE (about 8 minutes on 2 cores)"
    mkdir -p "$CACHE"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # its build script imports psutil and needs an old setuptools: build without isolation in a venv of its own
    "$PY" -m venv "$build/venv"
    "$build/venv/bin/python" -m pip install --quiet --upgrade pip
    "$build/venv/bin/python" -m pip install --quiet psutil "setuptools<70" wheel
    # its build script runs `python3 -c "import psutil"` from PATH: put the build venv first
    PATH="$build/venv/bin:$PATH" "$build/venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation --no-binary gfootball \
        "gfootball==$VERSION" -w "$build/wheels"
    cp "$build"/wheels/gfootball-"$VERSION"-*.whl "$CACHE"/
    wheel=$(ls "$CACHE"/gfootball-"$VERSION"-*.whl | head -n 1)
fi
echo "football: installing $wheel"
"$PY" -m pip install --quiet -c constraints.txt "$wheel" -e '.[football]'
"$PY" -c "import gfootball.env; print('football: gfootball imports')"
