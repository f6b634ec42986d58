"""Every example runs (at a small size) and writes its plot."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).parents[2] / "examples"


sys.path.insert(0, str(EXAMPLES))  # the examples import their shared helpers


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


def test_cnn_digits_equals_a_hand_written_nnx_optimizer_loop(tmp_path):
    result = load("cnn_digits").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    # 3 epochs of 18 batches, one Dropout draw a step: the state was carried
    assert result["steps"] == 54 == result["dropout_draws"]
    assert result["max_parameter_difference"] < 1e-4
    assert result["max_statistics_difference"] < 1e-4
    assert result["test_accuracy"][-1] == result["reference_test_accuracy"] > 0.8
    assert result["losses"][-1] < result["losses"][0]


def test_quickstart_every_family_reaches_rosenbrocks_minimum(tmp_path):
    result = load("quickstart").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    for name, run in result["results"].items():
        if "Adam" in name or "GradientDescent" in name or "Nelder-Mead" in name:
            continue  # first-order / derivative-free: slow on Rosenbrock at the small size
        assert run["retcode"] == "SUCCESS", name
        assert run["objective"] < 1e-12, name
        np.testing.assert_allclose(run["x"], [1.0, 1.0], atol=1e-5)


def test_constrained_design_reaches_the_best_known_spring(tmp_path):
    result = load("constrained_design").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    for method, run in result["results"].items():
        assert run["max_violation"] <= 1e-6, method
        # best known 0.012665 (Coello & Mezura-Montes 2002): within 0.5%, a local method
        assert abs(run["objective"] / 0.012665 - 1) < 5e-3, (method, run["objective"])


def test_line_search_example_matches_the_documented_loop(tmp_path):
    result = load("line_search").main(small=True, out=tmp_path)
    assert result["max_difference_to_documented_loop"] <= 1e-12
    runs = result["results"]
    assert runs["lbfgs (zoom)"]["retcode"] == "SUCCESS"
    # line-search trials are counted
    assert (
        runs["sgd + backtracking (Armijo)"]["f_evals"]
        > runs["sgd + backtracking (Armijo)"]["iterations"]
    )


def test_curve_fitting_matches_scipy_curve_fit(tmp_path):
    import scipy.optimize

    example = load("curve_fitting")
    result = example.main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    assert result["retcode"] == "SUCCESS"
    length, width, _, _ = example.petals()
    # method="trf": pcov from the Jacobian at the solution (scipy's default "lm" takes
    # MINPACK's last factorised Jacobian, an iterate earlier)
    popt, pcov = scipy.optimize.curve_fit(
        lambda t, a, b: a * t**b, length, width, p0=[0.2, 1.0], method="trf"
    )
    np.testing.assert_allclose(result["params"], popt, rtol=1e-6)
    np.testing.assert_allclose(result["stderr"], np.sqrt(np.diag(pcov)), rtol=1e-5)
    # the band is the delta method's: 1.96 standard errors of the fitted curve, > 0
    band = result["band"]
    assert np.all(band["half_width"] > 0)
    np.testing.assert_allclose(
        band["curve"], result["params"][0] * band["t"] ** result["params"][1], rtol=1e-12
    )


def test_minibatch_training_under_vmap_and_grad(tmp_path):
    result = load("minibatch_under_transformations").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    # every seed learned (chance is 0.1) and the ensemble is at least as good as its median
    assert min(result["member_accuracy"]) > 0.6
    assert result["ensemble_accuracy"] >= float(np.median(result["member_accuracy"]))
    # the learning rate learned through the minibatch training lowered the held-out loss
    assert result["learned_validation"] < result["initial_validation"]
    assert result["learned_rate"] > 0.05


def test_multistart_basins_finds_rastrigins_global_minimum(tmp_path):
    result = load("multistart_basins").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    assert result["objective"] < 1e-10 < 1.0 < result["single_objective"]
    assert result["global_runs"] >= 1 and result["basins"] > 10


def test_roots_continuation_traces_the_pressure_network_branch(tmp_path):
    result = load("roots_continuation").main(small=True, out=tmp_path)
    assert Path(result["plot"]).stat().st_size > 10_000
    assert result["retcode"] == "ReturnCode.SUCCESS" and result["iterations"] <= 10
    # every root of the batched solve from the singular start, and its implicit derivative
    assert result["max_flow_error"] < 1e-8
    assert result["max_derivative_vs_closed_form"] < 1e-7
    assert result["max_derivative_vs_fd"] < 1e-6
