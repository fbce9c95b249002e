# SPDX-License-Identifier: Apache-2.0
# real_size.py on a lent GPU machine (no network, minutes of device time): each measurement a part with its own time
# limit, so one slow part cannot cost the others, its JSON in $OUT and every line in $OUT/run.log.
#
# Here, once (the machine's transformers is older than our pin; wheels for its Python 3.12):
#   echo /.gpu/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .gpu/whl transformers==5.24.0 regex==2025.11.3
# There, carrying .gpu (the run's command line holds at most 2,000 characters):
#   source benchmarks/gpu_parts.sh; part smollm2_cuda_decode 200 $SMOLLM2 --parts decode --batch-sizes 1; ...
# DEVICE=cpu NO_INSTALL=1 OUT=/tmp/out runs the same here (PYTHON: the interpreter, python3 by default), to check a
# command before spending device time on it.

PYTHON=${PYTHON:-python3}
if [ -z "${NO_INSTALL:-}" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
LOG=$OUT/run.log
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nproc
  uptime
  "$PYTHON" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'peft', peft.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
} 2>&1 | tee -a "$LOG"

# part NAME SECONDS FLAGS...: `real_size.py FLAGS` under a limit of SECONDS, its results in $OUT/NAME.json.
part() {
  local name=$1 limit=$2
  shift 2
  echo "== $name $(date -u +%T), limit ${limit}s: $*" | tee -a "$LOG"
  timeout -k 5 "$limit" "$PYTHON" benchmarks/real_size.py --device "${DEVICE:-cuda}" "$@" \
    --output-json "$OUT/$name.json" >>"$LOG" 2>&1
  echo "== $name rc=$? $(date -u +%T)" | tee -a "$LOG"
  grep -E "^(decode|cold start|prefill|training|memory|Traceback|[A-Za-z]*Error)" "$LOG" | tail -n 8
}

# The real models' shapes with random weights (the GGUF files are over what travels with the tree).
SMOLLM2="--model benchmarks/configs/smollm2"
GEMMA3="--model benchmarks/configs/gemma3"
export SMOLLM2 GEMMA3
