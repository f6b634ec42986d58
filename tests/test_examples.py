"""Every example runs (at a small size) and writes its plot."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_demo_runs(capsys):
    load("demo").main()
    out = capsys.readouterr().out
    assert "optax.lbfgs()" in out and "SUCCESS" in out


def test_hyperparameter_learning_beats_grid_search(tmp_path):
    result = load("hyperparameter_learning").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    # learned per-feature strengths beat the best shared strength on validation data,
    # and the validation loss went down along the outer iterations
    assert result["learned_validation"] < result["grid_validation"]
    assert result["history"][-1] < result["history"][0]


def test_mlp_digits_trains_with_adam_and_lbfgs(tmp_path):
    result = load("mlp_digits").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    assert result["adam_train_loss"] < 0.5 * result["initial_loss"]
    assert result["lbfgs_train_loss"] < 0.1 * result["initial_loss"]
    # 10 classes: chance is 0.1
    assert result["adam_test_accuracy"] > 0.7 and result["lbfgs_test_accuracy"] > 0.7
