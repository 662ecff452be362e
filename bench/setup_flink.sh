#!/usr/bin/env bash
# A separate virtualenv with PyFlink for the Flink side of `ctiflow bench match`.
#
# PyFlink is kept out of the main venv on purpose: apache-flink pins its own versions of
# apache-beam, pandas, pyarrow, protobuf, … that conflict with pyspark's. bench/match_operator.py
# runs bench/match_flink.py with this venv's python in a subprocess.
#
#   bash bench/setup_flink.sh            # creates <repo>/.venv-flink
#   FLINK_VENV=/elsewhere bash bench/setup_flink.sh
#
# Needs: python3.9–3.12 (3.11 here), Java 11/17 on PATH (PyFlink starts a local JVM), PyPI.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
VENV="${FLINK_VENV:-$REPO/.venv-flink}"
PYTHON="${PYTHON:-python3.11}"
FLINK_VERSION="${FLINK_VERSION:-2.3.0}"

command -v "$PYTHON" >/dev/null || PYTHON=python3
command -v java >/dev/null || { echo "java not found on PATH: PyFlink needs a JVM (11 or 17)" >&2; exit 1; }

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "apache-flink==$FLINK_VERSION"
"$VENV/bin/python" -c "import pyflink, sys; print('pyflink', pyflink.__file__, file=sys.stderr)"
end=$(date +%s)

echo "PyFlink $FLINK_VERSION installed in $VENV in $((end - start)) s ($(du -sh "$VENV" | cut -f1))"
