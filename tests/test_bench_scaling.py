"""``finetune bench --scaling``: nested subsets trained in fresh processes, growth exponents, bad input.

No timing is asserted: the real run checks the report's shape, a fake run (its
breakdowns made up) checks the subsets, the flags and the verdict.
"""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
from pathlib import Path

import pytest
from bad_input.common import run_cli
from helpers import tiny_recipe

from finetune.bench.scaling import faster_than_linear_above, growth_exponent, judge_growth
from finetune.cli import main
from finetune.training.run_clock import PARTS

PROJECT = Path(__file__).parent.parent
REVIEWS = PROJECT / "data" / "reviews"
# data/reviews: 458 train, 111 validation and 111 test reviews.
SPLIT_ROWS = {"train": 458, "validation": 111, "test": 111}


def _recipe(folder: Path, model_dir: Path, **fields) -> Path:
    return tiny_recipe(folder, model_dir, folder / "unused", **fields)


def _scratch(tmp_path, monkeypatch) -> Path:
    """Every temporary folder goes here, so a test can see that none is left behind."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def test_scaling_trains_each_size_in_a_fresh_process(tmp_path, tiny_model_dir, monkeypatch, capsys):
    scratch = _scratch(tmp_path, monkeypatch)
    output = tmp_path / "scaling.json"
    recipe = _recipe(tmp_path, tiny_model_dir, eval_strategy="no", load_best_model_at_end="false")
    argv = ["bench", str(recipe), "--scaling", "--sizes", "1/4,1", "--updates", "2", "--output", str(output)]
    assert main(argv) == 0
    report = json.loads(output.read_text())
    assert [run["reviews"] for run in report["runs"]] == [170, 680]
    assert report["runs"][1]["splits"] == SPLIT_ROWS
    for run in report["runs"]:
        assert list(run["time_breakdown"]) == [*PARTS, "total"]
        assert run["time_breakdown"]["checkpoint_saves"] == 0  # no checkpoints
        assert run["process_seconds"] >= run["time_breakdown"]["total"] > 0
        assert run["load_average_after"] >= 0
    assert set(report["growth"]) == {*PARTS, "total", "process"}
    assert report["span"] == 4.0
    out = capsys.readouterr().out
    assert "| stage | 170 reviews | 680 reviews | exponent | growth |" in out
    assert "| train steps |" in out and "| test scoring |" in out and "| load average after (1 min) |" in out
    assert "faster than linearly" in out.splitlines()[-1]  # the verdict, whichever it is
    assert list(scratch.iterdir()) == []  # the subsets, runs and datasets caches are gone


class _FakeRun:
    """Stands in for ``python -m finetune train``: records what it was given, writes a made-up breakdown.

    ``tokenize`` costs n^2 / 10^5 seconds for n reviews, ``read`` n / 100, and every other part 1 s:
    only tokenize is to be flagged.
    """

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, module, arguments, stopped, env=None):
        import yaml

        recipe = yaml.safe_load(Path(arguments[1]).read_text())
        folder = Path(recipe["dataset_dir"])
        rows = {path.stem: list(csv.DictReader(path.open(encoding="utf-8"))) for path in folder.glob("*.csv")}
        self.calls.append({"module": module, "arguments": arguments, "recipe": recipe, "rows": rows, "env": env})
        reviews = sum(len(split) for split in rows.values())
        breakdown = dict.fromkeys(PARTS, 1.0)
        breakdown.update(read=reviews / 100, tokenize=reviews**2 / 1e5)
        breakdown["total"] = sum(breakdown.values())
        run_dir = Path(arguments[-1])  # the bench's --output_dir, after the user's
        (run_dir / "report").mkdir(parents=True)
        (run_dir / "report" / "metrics.json").write_text(json.dumps({"time_breakdown": breakdown}))
        return subprocess.CompletedProcess(arguments, 0, "", "")


def test_subsets_are_nested_the_flags_set_and_a_square_flagged(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import finetune.fetching.child_process

    fake = _FakeRun()
    monkeypatch.setattr(finetune.fetching.child_process, "run_python_module", fake)
    recipe = _recipe(tmp_path, tiny_model_dir, max_train_samples=300, seed=7)
    argv = ["bench", str(recipe), "--scaling", "--sizes", "1/8,1/4,1/2,1", "--learning_rate", "3e-4"]
    argv += ["--output_dir", "ignored"]
    assert main(argv) == 0
    assert [call["module"] for call in fake.calls] == ["finetune"] * 4
    # Each subset lies inside the next, split by split, in the source files' proportions.
    texts = [{split: [row["review"] for row in rows] for split, rows in call["rows"].items()} for call in fake.calls]
    for smaller, larger in itertools.pairwise(texts):
        for split, reviews in smaller.items():
            assert reviews == larger[split][: len(reviews)]
    assert {split: len(reviews) for split, reviews in texts[-1].items()} == SPLIT_ROWS
    assert {split: len(reviews) for split, reviews in texts[0].items()} == {"train": 57, "validation": 14, "test": 14}
    with (REVIEWS / "test.csv").open(encoding="utf-8") as handle:
        assert sorted(texts[-1]["test"]) == sorted(row["review"] for row in csv.DictReader(handle))
    # The recipe's settings, its source replaced by the subset and its cap on train reviews dropped.
    recipe_values = fake.calls[0]["recipe"]
    assert "max_train_samples" not in recipe_values and recipe_values["seed"] == 7
    assert recipe_values["learning_rate"] == pytest.approx(1e-3) and recipe_values["title_column"] == "title"
    arguments = fake.calls[0]["arguments"]
    assert arguments[0] == "train"
    flags = arguments[2:]
    assert flags[flags.index("--max_steps") + 1] == "20" and flags[flags.index("--save_strategy") + 1] == "no"
    assert flags[flags.index("--learning_rate") + 1] == "3e-4"  # the user's overrides are passed on
    assert flags[-2] == "--output_dir" and flags[-1] != "ignored"  # the bench's output folder wins
    assert fake.calls[0]["env"]["HF_DATASETS_CACHE"] != fake.calls[1]["env"]["HF_DATASETS_CACHE"]
    out = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in out if line.startswith("| ")}
    assert rows["tokenize"].endswith("| 2.00 | FASTER THAN LINEAR |")
    assert rows["read"].endswith("| 1.00 | at most linear |")
    assert rows["train steps"].endswith("| 0.00 | at most linear |")
    assert out[-1].startswith("growing faster than linearly: tokenize (2.00) (exponent above 1.34 over this 8.0x span")


def test_growth_exponents_and_the_verdict_by_hand():
    # Two sizes 8x apart, 1 s then 4 s: log 4 / log 8 = 2/3.
    assert growth_exponent([100, 800], [1.0, 4.0]) == pytest.approx(2 / 3)
    # The limit over an 8x span: 1 + 0.15 + ln 1.5 / ln 8 = 1.3450.
    assert faster_than_linear_above(8) == pytest.approx(1.3450, abs=1e-4)
    reviews = [1000, 2000, 4000, 8000]
    stages = {
        "fixed": [3.0] * 4,
        "linear": [n / 500 for n in reviews],
        "square": [n**2 / 1e7 for n in reviews],
        "just_under": [(n / 1000) ** 1.33 for n in reviews],
        "just_over": [(n / 1000) ** 1.36 for n in reviews],
        "short": [n / 1e5 for n in reviews],  # 0.08 s at the largest size
        "none": [0.0] * 4,
    }
    judged = judge_growth(reviews, [{stage: seconds[i] for stage, seconds in stages.items()} for i in range(4)])
    exponents = {stage: row["exponent"] for stage, row in judged["growth"].items()}
    assert exponents["fixed"] == pytest.approx(0.0, abs=1e-12)
    assert exponents["linear"] == pytest.approx(1.0)
    assert exponents["square"] == pytest.approx(2.0)
    assert exponents["none"] is None
    verdicts = {stage: row["verdict"] for stage, row in judged["growth"].items()}
    assert verdicts == {
        "fixed": "at most linear",
        "linear": "at most linear",
        "square": "FASTER THAN LINEAR",
        "just_under": "at most linear",
        "just_over": "FASTER THAN LINEAR",
        "short": "too short to judge",
        "none": "no time",
    }
    assert judged["faster_than_linear"] == ["square", "just_over"]
    assert judged["span"] == 8.0 and judged["faster_than_linear_above"] == pytest.approx(1.345, abs=1e-3)


def test_the_synthetic_reviews_are_seeded_varied_and_learnable(tmp_path):
    from finetune.data.synthetic import synthetic_reviews, write_synthetic_reviews
    from finetune.evaluation.baseline import run_baseline

    path = write_synthetic_reviews(tmp_path / "reviews.csv", 3000, seed=2)
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    # Fewer reviews are the first of more (a smaller benchmark file is the start of a bigger one).
    assert [(row["review"], int(row["stars"])) for row in rows[:50]] == list(synthetic_reviews(50, seed=2))
    assert list(synthetic_reviews(50, seed=2)) != list(synthetic_reviews(50, seed=3))
    words = sorted(len(row["review"].split()) for row in rows)
    assert words[0] < 15 and words[len(words) // 2] > 25 and words[-1] > 250  # short, typical and long reviews
    assert {row["stars"] for row in rows} == {"1", "2", "3", "4", "5"}
    texts, labels = [row["review"] for row in rows], [int(row["stars"]) - 1 for row in rows]
    scored = run_baseline(texts[:2000], labels[:2000], {"test": (texts[2000:], labels[2000:])}, list("12345"))
    assert scored.scores["test"]["accuracy"] > 0.5  # 5 classes: chance is 0.2


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--sizes", "1/4"], "--sizes needs at least two sizes to measure growth"),
        (["--sizes", "1/2,1/4"], "--sizes must grow from the first to the last"),
        (["--sizes", "a,1"], "--sizes takes fractions of the reviews (above 0, at most 1) or counts"),
        (["--sizes", "0,1"], "--sizes takes fractions of the reviews (above 0, at most 1) or counts"),
        (["--sizes", "100,100000"], "--sizes asks for 100,000 reviews and the source gives 680"),
        (["--sizes", "100,1000", "--max_reviews", "200"], "--sizes asks for 1,000 reviews and --max_reviews gives 200"),
        (["--sizes", "0.6,1"], "--sizes span 1.67x (408 to 680 reviews), too little to tell growth from noise"),
        (["--max_reviews", "1"], "--max_reviews must be >= 2 (got 1)"),
        (["--memory"], "--scaling and --memory are two benches"),
        (["--count_ops"], "--count_ops is for the training systems' bench, not --scaling; run them one at a time"),
        (["--learning_rat", "1e-3"], "unknown flag '--learning_rat'; did you mean 'learning_rate'?"),
    ],
)
def test_bad_scaling_input_is_one_line(tmp_path, tiny_model_dir, capsys, flags, expected):
    line = run_cli(["bench", str(_recipe(tmp_path, tiny_model_dir)), "--scaling", *flags], capsys)
    assert line.startswith(f"error: {expected}"), line


def test_bad_scaling_sources_are_one_line(tmp_path, tiny_model_dir, capsys):
    recipe = str(_recipe(tmp_path, tiny_model_dir))
    assert run_cli(["bench", recipe, "--sizes", "1/4,1"], capsys) == (
        "error: --sizes goes with --scaling; add --scaling, or drop it"
    )
    assert run_cli(["bench", "--scaling"], capsys) == (
        "error: finetune bench --scaling needs a recipe, a reviews file or --synthetic N, e.g. "
        "finetune bench recipes/imdb.yaml --scaling --max_reviews 8000"
    )
    assert (
        run_cli(["bench"], capsys) == "error: finetune bench needs a recipe, e.g. finetune bench recipes/drugscom.yaml"
    )
    assert run_cli(["bench", recipe, "--memory", "--count_ops"], capsys) == (
        "error: --count_ops is for the training systems' bench, not --memory; run them one at a time"
    )
    missing = tmp_path / "missing.csv"
    assert run_cli(["bench", missing, "--scaling"], capsys) == (
        f"error: reviews file not found: {missing}; check the path"
    )
    assert run_cli(["bench", missing, "--scaling", "--synthetic", "100"], capsys) == (
        f"error: give a reviews file ({missing}) or --synthetic N, not both"
    )
    hub = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "unused", dataset_dir=None, dataset_name="yelp_review_full")
    assert run_cli(["bench", hub, "--scaling"], capsys).startswith(
        "error: --scaling reads local files, and yelp_review_full comes from the Hugging Face Hub;"
    )


def test_a_failed_run_is_one_line_naming_its_size(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import finetune.fetching.child_process

    def failing(module, arguments, stopped, env=None):
        return subprocess.CompletedProcess(arguments, 2, "", "reading\nerror: the column 'review' is missing\n")

    monkeypatch.setattr(finetune.fetching.child_process, "run_python_module", failing)
    assert main(["bench", str(_recipe(tmp_path, tiny_model_dir)), "--scaling"]) == 2
    # After the progress lines, one error naming the size (1/8 of 680 reviews) and the run's own error.
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: the run on 85 reviews failed: the column 'review' is missing"
    )


def test_synthetic_reviews_past_the_cap_are_refused_up_front_saying_the_cost(capsys, monkeypatch):
    """``--synthetic 1000000000`` started writing about 350 GB of reviews without a word (issue 73)."""
    import tempfile

    made = []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *args, **kwargs: made.append(args) or "/nonexistent")
    assert run_cli(["bench", "--scaling", "--synthetic", "1000000000"], capsys) == (
        "error: --synthetic 1,000,000,000 would write about 351 GB of reviews (about 21 h) before the first run; "
        "the most is 10,000,000 (about 3.5 GB); try --synthetic 200000"
    )
    assert made == []  # refused before any work folder was made


def test_synthetic_reviews_under_the_cap_say_their_cost_first(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import finetune.bench.scaling as scaling

    monkeypatch.setattr(scaling, "_run_sizes", lambda *args: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        scaling.bench_scaling(None, ["--model_name_or_path", str(tiny_model_dir)], synthetic=5000)
    assert "writing 5,000 synthetic reviews: about 1.8 MB of reviews (under a second)" in capsys.readouterr().err
