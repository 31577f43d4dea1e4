"""``finetune predict`` streams: bounded memory on a long file, and stdin lines answered as they arrive."""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
from pathlib import Path

import warm_processes

PROJECT = Path(__file__).parent.parent
WORDS = ["great", "terrible", "fine", "broke", "love", "awful", "okay", "cheap"]
# Each row carries a 400-character column the model never reads: an implementation that keeps
# the rows (or the results) grows by at least 100k x 400 bytes = 38 MiB, one that streams does not.
PAYLOAD = "x" * 400

# Peak memory is VmHWM, the high-water mark of this process's own address space: ru_maxrss
# would carry over the peak of the (large) test process that started it.
_CHILD = """
import json, sys
from finetune.commands.predict import predict

def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

model, small, big, output = sys.argv[1:5]
predict(model, small, output + ".warm.csv", batch_size=256)  # model, tokenizer and one full batch in memory
before = peak_kib()
count = predict(model, big, output, batch_size=256)
print(json.dumps({"count": count, "peak_before_kib": before, "peak_after_kib": peak_kib()}))
"""


def _child_env() -> dict[str, str]:
    # One thread: the test is about memory, and two cores shared with other work run it faster so.
    return {**os.environ, "PYTHONPATH": str(PROJECT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _write_reviews(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as handle:
        handle.write("review,note\n")
        for _ in range(rows):
            handle.write(f"{rng.choice(WORDS)},{PAYLOAD}\n")


def test_predict_on_100k_rows_keeps_peak_memory_flat(tiny_model_dir, tmp_path):
    small, big = tmp_path / "small.csv", tmp_path / "big.csv"
    _write_reviews(small, 3_000)
    _write_reviews(big, 100_000)
    output = tmp_path / "out.csv"
    # A process of its own, not one forked from tests/warm_processes.py: a fork would start from the
    # forkserver's high-water mark, above what the rows could add.
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tiny_model_dir), str(small), str(big), str(output)],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["count"] == 100_000
    with output.open(encoding="utf-8") as handle:
        assert sum(1 for _ in handle) == 100_001
    # Peak resident memory after 100k rows against after 3k: the input alone is 40 MB.
    growth_mib = (figures["peak_after_kib"] - figures["peak_before_kib"]) / 1024
    assert growth_mib < 20, f"peak memory grew by {growth_mib:.0f} MiB over 100k rows"
    assert not list(tmp_path.glob(".*.partial"))


def _line_queue(stream) -> queue.Queue:
    """Lines of ``stream`` as a reader thread gets them, so the test can wait for one with a time limit."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def test_stdin_lines_are_answered_as_they_arrive(tiny_model_dir):
    process = warm_processes.Popen(
        [sys.executable, "-m", "finetune", "predict", str(tiny_model_dir)],
        stdin=warm_processes.PIPE,
        stdout=warm_processes.PIPE,
        stderr=warm_processes.DEVNULL,
        text=True,
        env=_child_env(),
        cwd=PROJECT,
    )
    try:
        lines = _line_queue(process.stdout)
        # Each review is answered while stdin is still open: nothing waits for the end of input.
        process.stdin.write("great value\n")
        process.stdin.flush()
        assert lines.get(timeout=120).startswith("text,label,probability,")
        assert lines.get(timeout=120).startswith("great value,")
        process.stdin.write("broke in a week\n")
        process.stdin.flush()
        assert lines.get(timeout=120).startswith("broke in a week,")
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


def test_tsv_output_is_tab_separated_and_a_tsv_input_answers_in_kind(tiny_model_dir, tmp_path):
    import csv

    from finetune.commands.predict import predict

    (tmp_path / "in.csv").write_text('review\n"fine, really"\nbroke\n', encoding="utf-8")
    predict(str(tiny_model_dir), str(tmp_path / "in.csv"), str(tmp_path / "out.tsv"))
    with (tmp_path / "out.tsv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert [row["review"] for row in rows] == ["fine, really", "broke"]
    assert all(row["label"] for row in rows)

    # With no extension on --output, the answer takes the input's format. A TSV review may open with a
    # quoted word: TSV is often written without quoting, and is read leniently.
    (tmp_path / "in.tsv").write_text('review\tnote\n"Best" buy ever\tx\n', encoding="utf-8")
    predict(str(tiny_model_dir), str(tmp_path / "in.tsv"), str(tmp_path / "answers"))
    assert (tmp_path / "answers").read_text(encoding="utf-8").splitlines()[0].startswith("review\tnote\tlabel\t")
