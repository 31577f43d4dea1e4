#!/usr/bin/env bash
# Prepare .gpu_carry/ for tools/gpu_bench.sh: run HERE (a machine with PyPI), in the repository root, before the
# one device call. It costs no device time.
#
#   bash tools/gpu_prepare.sh            # then, on the device: run(command="bash tools/gpu_bench.sh",
#                                        #   carry=[".gpu_carry"], timeout_s=560)
#
# The device image (see /work/.library/device/KINDS.md) has torch, accelerate, tokenizers, pyarrow, scikit-learn,
# pytest ..., but transformers 5.17 (this project pins 5.23) and no datasets or evaluate, and it reaches no network.
# The carry limit is 64 MiB in all, so the models' weights (MiniLM 88 MB, MPNet 419 MB) cannot travel: only their
# config and tokenizer files do, and gpu_bench.sh builds models of exactly those shapes with random weights there.
# Speeds, MFU, memory and syncs do not depend on the weights; scores do, so none measured there is a real score.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CARRY=.gpu_carry
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels" "$CARRY/models" "$CARRY/cache/datasets"

# 1. Wheels for the device's Python 3.12 (x86-64), without dependencies: only what the image lacks or has too old.
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$CARRY/wheels" transformers==5.23.0 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 captum==0.9.0

# 2. Config and tokenizer files (no weights) of the packaged MiniLM and of MPNet, from this machine's copies.
"$PYTHON" - "$CARRY/models" <<'PY'
import shutil
import sys
from pathlib import Path

from finetune.training.modeling import resolve_model_path

for name in ("all-minilm-l6-v2", "all-mpnet-base-v2"):
    source = Path(resolve_model_path(name))  # MPNet is fetched into the cache on first use (a PyPI wheel)
    target = Path(sys.argv[1]) / name
    target.mkdir()
    for path in source.iterdir():
        if path.is_file() and path.suffix in (".json", ".txt", ".model") or path.name == "vocab.txt":
            shutil.copy(path, target / path.name)
    print(f"{name}: {sorted(p.name for p in target.iterdir())}")
PY

# 3. The drugscom data, as this machine's cache holds it (fetched once: finetune data fetch drugscom).
"$PYTHON" -m finetune data fetch drugscom >/dev/null
cp -r "${FINETUNE_CACHE:-$HOME/.cache/finetune}/datasets/drugscom" "$CARRY/cache/datasets/"

# 4. 640 imdb reviews (seed 0) for the MFU step: long reviews at their real lengths, 1 MB instead of the 32 MB file.
"$PYTHON" -m finetune data fetch imdb >/dev/null
"$PYTHON" - "${FINETUNE_CACHE:-$HOME/.cache/finetune}" "$CARRY/imdb_sample.csv" <<'PY'
import sys
from pathlib import Path

import pandas as pd

source = next(Path(sys.argv[1], "datasets", "imdb").glob("*/imdb_train.csv"))
pd.read_csv(source).sample(n=640, random_state=0).to_csv(sys.argv[2], index=False)
print(f"imdb sample: 640 reviews of {source}")
PY

du -sh "$CARRY"
echo "ready: carry .gpu_carry (must stay well under 64 MiB with the working tree)"
