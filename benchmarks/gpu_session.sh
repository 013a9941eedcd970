#!/usr/bin/env bash
# The device checklist for a session lent a GPU machine, as one command (device time is scarce).
#
# On the device machine (its own python3 with a CUDA torch; nothing can be fetched there, so orjson
# travels as a wheel in .whl/, see /work/.library/device/README.md):
#
#     bash benchmarks/gpu_session.sh            # writes $OUT/log (and a few traces) when OUT is set
#     bash benchmarks/gpu_session.sh tests      # the native build and the tests only
#
# Each step has its own time limit, so one hang does not eat the whole call; a failed step is
# reported and the next one runs. The figures go into docs/benchmarks.md ("On a GPU").
set -u
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
LOG=$OUT/log
export PYTHONUNBUFFERED=1
exec > >(tee -a "$LOG") 2>&1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
else
  export PYTHONPATH=$PWD/src:$PWD
fi

step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2
  shift 2
  echo "=== $name ($(date +%T))"
  local start=$SECONDS
  timeout "$limit" "$@"
  echo "=== $name: exit $? in $((SECONDS - start)) s"
}

step 30 env python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"
step 150 native python3 -m layerscope native build
step 200 tests python3 -m pytest -p no:warnings -q tests/test_cuda.py tests/test_nvtx.py \
  tests/test_program_unchanged.py tests/test_checkpointing.py tests/test_memory_baseline.py
step 60 "cli on cuda" python3 -m pytest -p no:warnings -q tests/test_cli.py -k cuda
[ "${1:-all}" = tests ] && exit 0
step 120 postprocess python3 benchmarks/postprocess.py --device cuda --steps 20
step 120 flight python3 benchmarks/flight.py --device cuda --rounds 7 --skip signal,ring
step 90 "profiler floor" python3 benchmarks/profiler_floor.py --device cuda --rounds 7
step 60 "detail breakdown" python3 benchmarks/detail_breakdown.py --device cuda --cycles 3 --top 25
step 90 traces python3 benchmarks/gpu_traces.py "$OUT/traces" --only cuda_graph --only train_resnet
for trace in "$OUT"/traces/*.json.gz; do
  step 60 "critical path $(basename "$trace")" python3 -m layerscope analyze "$trace" --critical-path --depth 2 --top 5
done
step 60 estimate python3 -m layerscope estimate gpt --device h200 --depth 2 --top 5
step 60 measured python3 -m layerscope profile gpt --device cuda --memory --steps 3 --depth 2 --top 5
echo "=== done ($(date +%T))"
