#!/usr/bin/env bash
# The prepared run for a lent GPU machine: every GPU measurement of the project in two commands that each fit one
# device call (at most 10 minutes), their results packed into one archive under $OUT.
#
# On the GPU machine (after ../shared/device/pack here, carrying .device; the MiniLM folder is then $MINILM):
#   source .device/env.sh && bash benchmarks/on_gpu.sh checks      # gpu.py (<= 300 s) + step_overhead --device cuda
#   source .device/env.sh && bash benchmarks/on_gpu.sh finetune    # finetune_code.py --device cuda --size gpu (<= 8 min)
# Where the session's device time holds one call of about 7 minutes and a short second one:
#   source .device/env.sh && bash benchmarks/on_gpu.sh short       # step_overhead, the GPU size at 2 seeds of the
#                                                                  # in-batch and mined recipes, gpu.py --quick (~9 min)
#   source .device/env.sh && bash benchmarks/on_gpu.sh drift       # 3 epochs, mined once against online (seed 0)
# Here, on the CPU, the same commands at small sizes (a dry run of the script itself):
#   bash benchmarks/on_gpu.sh checks --dry-run
#   bash benchmarks/on_gpu.sh finetune --dry-run --model DIR [--recipes ...]   # any sentence-transformers folder
#
# Each command is stopped at its own time limit (a part that overruns is recorded, the others still run) and
# writes $OUT/PART.tgz (every result file and log) and $OUT/PART.log (the tail of each log): two files back.
set -uo pipefail
part=${1:-}; shift || true
dry=0; model=${MINILM:-}; extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --model) model=$2; shift ;;
    *) extra+=("$1") ;;  # passed on to finetune_code.py (e.g. --recipes NAME ...)
  esac
  shift
done
case $part in checks|finetune|short|drift) ;; *) echo "usage: on_gpu.sh checks|finetune|short|drift [--dry-run] [--model DIR]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}; [ -x .venv/bin/python ] && [ $dry = 1 ] && PY=.venv/bin/python
OUT=${OUT:-$(mktemp -d)}; work=$(mktemp -d); mkdir -p "$OUT"
device=cuda; [ $dry = 1 ] && device=cpu
status=0

step() {  # step NAME SECONDS COMMAND...: run it under its limit, log it, remember a failure
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  [ $rc = 124 ] && echo "$name: stopped at its limit of $limit s" >> "$work/$name.log"
  echo "$name: exit $rc in $((SECONDS - start)) s" >> "$work/summary.txt"
  [ $rc = 0 ] || status=1
}

if [ $part = checks ]; then
  if [ $dry = 1 ]; then
    step gpu_check 200 "$PY" benchmarks/gpu.py --device cpu --quick --out "$work/results"
    step step_overhead 200 "$PY" benchmarks/step_overhead.py --quick --steps 20 --out "$work/results"
  else
    step gpu_check 330 "$PY" benchmarks/gpu.py --out "$work/results"
    step step_overhead 200 "$PY" benchmarks/step_overhead.py --device cuda --out "$work/results"
  fi
elif [ $part = short ] || [ $part = drift ]; then
  [ -n "$model" ] || { echo "on_gpu.sh $part: no model folder (--model DIR, or \$MINILM from .device/env.sh)" >&2; exit 2; }
  q=(); [ $dry = 1 ] && q=(--quick)
  ST_IN="sentence-transformers, in-batch (MNRL)"; IN="this project, in-batch (InfoNCE)"
  OFF="this project, mined once from the warm table"; ON="this project, mined online (warm table, refreshed)"
  if [ $part = short ]; then
    if [ $dry = 1 ]; then step step_overhead 120 "$PY" benchmarks/step_overhead.py --quick --steps 20 --out "$work/results"
    else step step_overhead 60 "$PY" benchmarks/step_overhead.py --device cuda --steps 100 --out "$work/results"; fi
    # This project's recipes first, then sentence-transformers' in-batch merged beside them (its two runs took
    # 81 s and 54 s on the first H200 lease, where a 220-s part running it first ended before ours began).
    step finetune_gpu 200 "$PY" benchmarks/finetune_code.py --device $device --size gpu "${q[@]}" --seeds 0 1 \
      --model "$model" --out "$work/results" --recipes "$IN" "$OFF" "$ON" "${extra[@]}"
    step finetune_gpu_st 170 "$PY" benchmarks/finetune_code.py --device $device --size gpu "${q[@]}" --seeds 0 1 \
      --model "$model" --out "$work/results" --merge --recipes "$ST_IN" "${extra[@]}"
    step gpu_check 95 "$PY" benchmarks/gpu.py --device $device --quick --out "$work/results"
  else  # the GPU size's corpus (every training pair the machine's packages give) for 3 epochs
    refresh=100; [ $dry = 1 ] && refresh=8
    step finetune_drift 300 "$PY" benchmarks/finetune_code.py --device $device --size gpu "${q[@]}" --seeds 0 \
      --epochs 3 --refresh-every $refresh --name finetune_code_gpu_3epochs --model "$model" \
      --out "$work/results" --recipes "$OFF" "$ON" "${extra[@]}"
  fi
else
  if [ -z "$model" ]; then
    echo "on_gpu.sh finetune: no model folder (--model DIR, or \$MINILM from .device/env.sh)" >&2; exit 2
  fi
  if [ $dry = 1 ]; then
    step finetune_gpu 580 "$PY" benchmarks/finetune_code.py --device cpu --size gpu --quick --seeds 0 \
      --model "$model" --out "$work/results" "${extra[@]}"
  else
    step finetune_gpu 560 "$PY" benchmarks/finetune_code.py --device cuda --size gpu --model "$model" \
      --out "$work/results" "${extra[@]}"
  fi
fi

tar -czf "$OUT/$part.tgz" -C "$work" .
{ cat "$work/summary.txt"; for f in "$work"/*.log; do echo "===== $(basename "$f") (last 40 lines)"; tail -n 40 "$f"; done; } \
  > "$OUT/$part.log"
cat "$OUT/$part.log" | tail -n 60
rm -rf "$work"
exit $status
