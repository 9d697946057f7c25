#!/usr/bin/env bash
# The environment of bench/peers.py: .venv-peers at the repository's root, Python 3.11,
# with the in-process readers cutfs is compared with, at pinned versions. It is apart
# from .venv: torchcodec 0.17 loads only with torch 2.14 (PyPI's default build of 2.14.1,
# which pulls CUDA libraries, about 6 GB; no GPU is needed), and .venv keeps the CPU build
# of torch 2.13 (scripts/cpu-torch-constraints.txt).
#
# Idempotent: an existing .venv-peers whose versions match and whose torchcodec loads is
# reused as it is. torchcodec decodes with the system's FFmpeg shared libraries (4 to 8;
# Debian's ffmpeg package brings them), found by the dynamic loader at import.
#
#     ./scripts/setup_peers.sh            # then: .venv-peers/bin/python bench/peers.py
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-peers
python=${PYTHON:-python3.11}
# lhotse 1.33.0 imports urllib3 (lhotse/ais) without declaring it.
pins=(torch==2.14.1 torchcodec==0.17.0 datasets==5.2.0 lhotse==1.33.0 soundfile==0.14.0 numpy urllib3)

# cutfs itself runs from .venv (the bench mounts with it), which scripts/setup.sh makes,
# with the system packages the bench uses too (ffmpeg, sox, fuse3).
[[ -x .venv/bin/python ]] || ./scripts/setup.sh

# Prints the distributions that are missing or whose version differs from the pin.
check_versions='
import importlib.metadata as metadata
import sys

for pin in sys.argv[1:]:
    name, _, wanted = pin.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        found = "missing"
    if found == "missing" or wanted and found.split("+")[0] != wanted:
        print(name, found, "(wanted", (wanted or "any") + ")")
'
# Fails (with the library's own message) unless every peer imports, and torchcodec finds
# FFmpeg.
check_load='
import datasets
import lhotse
import soundfile
import torch
import torchcodec
from torchcodec.decoders import AudioDecoder
'

if [[ -x $venv/bin/python ]] \
    && ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup_peers: $venv is not Python 3.11: making it again"
    rm -rf "$venv"
fi
if [[ ! -x $venv/bin/python ]]; then
    "$python" -m venv "$venv"
fi

stale=$("$venv/bin/python" -c "$check_versions" "${pins[@]}")
if [[ -z $stale ]] && "$venv/bin/python" -c "$check_load" 2>/dev/null; then
    echo "setup_peers: $venv is up to date"
else
    echo "setup_peers: installing the peers into $venv"
    [[ -n $stale ]] && sed 's/^/  had: /' <<<"$stale"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${pins[@]}"
    stale=$("$venv/bin/python" -c "$check_versions" "${pins[@]}")
    if [[ -n $stale ]]; then
        echo "setup_peers: pip installed other versions: $stale" >&2
        exit 1
    fi
    if ! "$venv/bin/python" -c "$check_load"; then
        echo "setup_peers: a peer does not import (above: why); torchcodec needs FFmpeg's" \
            "shared libraries 4 to 8 (apt-get install ffmpeg)" >&2
        exit 1
    fi
fi

"$venv/bin/python" - <<'EOF'
import importlib.metadata as metadata
import platform

import soundfile
import torch
import torchcodec
from torchcodec._core import get_ffmpeg_library_versions

print(f"setup_peers: ready: {platform.python_implementation()} {platform.python_version()}")
for name in ("torch", "torchcodec", "datasets", "lhotse", "soundfile", "numpy", "urllib3"):
    print(f"  {name}=={metadata.version(name)}")
print(f"  torch {torch.__version__}, torchcodec {torchcodec.__version__}")
print(f"  torchcodec loads FFmpeg {get_ffmpeg_library_versions()['ffmpeg_version']} "
      f"({torchcodec.core_library_path.rsplit('/', 1)[-1]})")
print(f"  soundfile's libsndfile {soundfile.__libsndfile_version__}")
EOF
