#!/usr/bin/env bash
# Set up (see setup.sh), then run the linters, the type checker and the whole test suite,
# real FUSE mounts included (they need /dev/fuse and are skipped without it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
