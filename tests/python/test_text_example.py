"""The transformer example on real text (examples/python/train_text.py) in its quick mode, CI's
short run: a tiny GPT-style decoder on the World English Bible that Debian's sword-text-web ships,
dense and converted by dropit from the same weights, on the same batches, for two seeds. Skipped,
saying so, only where the corpus is not installed (scripts/install-deps installs it)."""

import csv
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import train_text  # noqa: E402

corpus_installed = pytest.mark.skipif(
    not os.path.isfile(os.path.join(train_text.CORPUS_DIR, "ot.bzz")),
    reason=f"the text corpus is not installed at {train_text.CORPUS_DIR}: Debian's "
    f"{train_text.CORPUS_PACKAGE} (scripts/install-deps installs it)")


def test_missing_corpus_names_the_package(tmp_path):
    with pytest.raises(SystemExit, match=train_text.CORPUS_PACKAGE):
        train_text.load_corpus(str(tmp_path))


@corpus_installed
def test_corpus_is_plain_english_split_without_overlap():
    text = train_text.load_corpus()
    assert len(text.encode("utf-8")) > 4_000_000
    assert "In the beginning, God created the heavens and the earth." in text
    assert "Yahweh is my shepherd;\nI shall lack nothing." in text
    assert "<" not in text and ">" not in text  # no markup left
    train, val = train_text.split(text)
    assert len(train) + len(val) == len(text.encode("utf-8"))
    assert 0.09 < len(val) / (len(train) + len(val)) < 0.11
    # The held-out text is not in the training split.
    training = bytes(train.tolist())
    assert bytes(val[:20000].tolist()) not in training
    assert bytes(val[-20000:].tolist()) not in training


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("text")
    return train_text.main(["--quick", "--out-dir", str(out)]), out


@corpus_installed
def test_quick_mode_trains_both_runs_from_the_same_start(quick):
    pairs, _ = quick
    assert len(pairs) == 2
    for dense, converted in pairs:
        assert (dense.name, converted.name) == ("dense", "dropit")
        # Same initial weights and the same first batch: the same first loss and validation loss
        # (dropit's forward is exact), near log(256) for 256 equally likely bytes.
        assert converted.losses[0] == pytest.approx(dense.losses[0], abs=1e-5)
        assert converted.val_losses[0] == pytest.approx(dense.val_losses[0], abs=1e-5)
        assert dense.losses[0] == pytest.approx(math.log(256), abs=0.05)
        for run in (dense, converted):
            assert len(run.losses) == len(run.step_helds) == 40
            assert all(math.isfinite(v) for v in run.losses + run.val_losses)
            first, last = sum(run.losses[:5]) / 5, sum(run.losses[-5:]) / 5
            assert last < first - 1.0, (run.name, first, last)
            assert run.val_steps == [0, 20, 40]
            assert run.val_loss < run.val_losses[0] - 1.0
        assert converted.held_bytes < dense.held_bytes
        assert converted.peak_bytes < dense.peak_bytes


@corpus_installed
def test_quick_mode_writes_the_report(quick):
    pairs, out = quick
    with open(out / "results.md") as f:
        report = f.read()
    assert report.startswith("Command: `python3 examples/python/train_text.py --quick")
    assert "| dense | " in report and "| dropit | " in report
    for dense, converted in pairs:
        assert f"| {dense.seed} | {dense.val_loss:.4f} (" in report
        assert f"{converted.val_loss - dense.val_loss:+.4f}" in report
    held = max(p[1].held_bytes for p in pairs) / max(p[0].held_bytes for p in pairs)
    assert f" | {held:.2f}x | " in report
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["seed"]), r["run"]) for r in rows] == [(0, "dense"), (0, "dropit"),
                                                          (1, "dense"), (1, "dropit")]
    for row, run in zip(rows, [run for pair in pairs for run in pair]):
        assert float(row["val_loss_nats_per_byte"]) == pytest.approx(run.val_loss, abs=1e-5)
        assert int(row["held_after_forward_bytes"]) == run.held_bytes
    with open(out / "curves.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 2 * 2 * 41
