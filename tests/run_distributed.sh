#!/usr/bin/env bash
# Run the tests marked world_size(N) on N real processes over gloo, launched the way Composer users
# launch: `python -m composer.cli.launcher -n N --master_port PORT -m pytest`. Rank 0 prints to the
# terminal; the other ranks write to log files that are printed when any rank fails.
set -euo pipefail
ranks="${1:-2}"
shift || true
python="${PYTHON:-python}"
logs="$(mktemp -d)"
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cd "$(dirname "$0")/.."
if ! "$python" -m composer.cli.launcher -n "$ranks" --master_port "$port" \
    --stdout "$logs/rank{rank}.stdout" --stderr "$logs/rank{rank}.stderr" \
    -m pytest -q -p no:cacheprovider tests "$@"; then
  for f in "$logs"/rank*.std*; do
    [ -s "$f" ] && { echo "===== $f (last 80 lines)"; tail -n 80 "$f"; }
  done
  exit 1
fi
rm -rf "$logs"
