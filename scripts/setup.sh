#!/usr/bin/env bash
# Set up cutfs on a fresh Debian/Ubuntu machine: system packages (as root),
# a virtual environment in .venv and the package with its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(fuse3 libfuse3-dev pkg-config ffmpeg sox espeak-ng libsndfile1 python3-venv procps systemd
    e2fsprogs gdb attr)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup: please install as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c scripts/cpu-torch-constraints.txt -e '.[test,compat,cluster]'
# Azurite (Azure Blob Storage's emulator, for the az:// tests on loopback) from npm, under
# .venv/node; without npm those tests are skipped.
if ! command -v npm >/dev/null && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null || true
fi
if command -v npm >/dev/null && [[ ! -x .venv/node/node_modules/.bin/azurite-blob ]]; then
    npm install --silent --prefix .venv/node azurite@3 >/dev/null \
        || echo "setup: could not install azurite: the az:// tests will be skipped" >&2
fi
# pyannote.audio and torchaudio run in an environment of their own (scripts/compat.py says
# why): about 2 GB of downloads, so only where asked (CI asks).
if [[ ${CUTFS_WITH_PYANNOTE:-0} == 1 ]]; then
    .venv/bin/python scripts/compat.py --build-pyannote
fi
echo "setup: ready ($(.venv/bin/cutfs --help >/dev/null && echo cutfs installed in .venv/bin))"

# mount(8) runs helpers with a fixed PATH (/usr/local/bin and the system directories),
# so fstab entries of type fuse.cutfs need cutfs there.  Root only; an existing
# cutfs that is not a link is left alone.
if [[ $(id -u) -eq 0 ]] && { [[ ! -e /usr/local/bin/cutfs ]] || [[ -L /usr/local/bin/cutfs ]]; }; then
    ln -sfn "$PWD/.venv/bin/cutfs" /usr/local/bin/cutfs
fi
