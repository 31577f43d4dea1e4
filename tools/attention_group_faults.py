"""What a packed row's attention group costs on a CPU when its scores pass glibc's mmap threshold.

    python tools/attention_group_faults.py                   # 8 reviews of 512 tokens, MiniLM's 12 heads
    python tools/attention_group_faults.py --reviews 16 --width 256

One group of ``reviews`` x ``width`` tokens is read by the packed path's CPU attention
(``review_attention.biased_attention_with_dropout``, dropout 0.1), forward and backward, split into
groups of 1, 2, 4, ... reviews. Each split runs in a fresh process (malloc's thresholds move as a process
frees blocks), 3 warm-up steps then 20 timed ones, splits round-robin over ``--rounds``; the table gives
milliseconds and minor page faults per step, and each group's scores in MiB. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

HEADS, HEAD_SIZE = 12, 32  # MiniLM's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # run one split, print JSON
    options = parser.parse_args()
    if options.child is not None:
        print(json.dumps(_time_split(options.reviews, options.width, options.child)))
        return
    splits = [size for size in (1, 2, 4, 8, 16, 32, 64) if size <= options.reviews][::-1]
    results: dict[int, list[dict]] = {size: [] for size in splits}
    for _ in range(options.rounds):
        for size in splits:
            command = [sys.executable, __file__, "--reviews", str(options.reviews), "--width", str(options.width)]
            output = subprocess.run([*command, "--child", str(size)], capture_output=True, text=True, check=True)
            results[size].append(json.loads(output.stdout))
    print(f"{options.reviews} reviews of {options.width} tokens, {HEADS} heads, fp32, {options.rounds} rounds")
    print("| reviews per group | scores per group MiB | ms per step | page faults per step |")
    print("| --- | --- | --- | --- |")
    for size in splits:
        runs = results[size]
        milliseconds = sum(run["ms"] for run in runs) / len(runs)
        faults = sum(run["faults"] for run in runs) / len(runs)
        mib = size * HEADS * options.width**2 * 4 / 2**20
        print(f"| {size} | {mib:.1f} | {milliseconds:.1f} | {faults:,.0f} |")


def _time_split(reviews: int, width: int, group_size: int) -> dict[str, float]:
    import torch

    from finetune.fast_path.review_attention import biased_attention_with_dropout

    torch.manual_seed(0)
    query, key, value = (torch.randn(reviews, HEADS, width, HEAD_SIZE, requires_grad=True) for _ in range(3))
    mask = torch.zeros(reviews, 1, 1, width)

    def step() -> None:
        outputs = [
            biased_attention_with_dropout(
                query[start : start + group_size],
                key[start : start + group_size],
                value[start : start + group_size],
                mask[start : start + group_size],
                0.1,
                HEAD_SIZE**-0.5,
            )
            for start in range(0, reviews, group_size)
        ]
        torch.cat(outputs).sum().backward()

    for _ in range(3):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    for _ in range(20):
        step()
    return {
        "ms": (time.perf_counter() - started) / 20 * 1000,
        "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 20,
    }


if __name__ == "__main__":
    main()
