"""progress=True: a tqdm bar driven from inside the compiled loop, and from the training loop."""

import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import OptimizationProblem, solve


def test_progress_bar_reaches_maxiters(capsys):
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(3))
    sol = solve(prob, optsolve.Adam(0.01), maxiters=500, progress=True)
    err = capsys.readouterr().err
    assert "500/500" in err and "loss=" in err and "grad_norm=" in err
    assert int(sol.stats.iterations) == 500


def test_progress_bar_when_training_on_data(capsys):
    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(8, 2)),) for _ in range(10)]
    prob = OptimizationProblem(lambda w, p, b: jnp.mean((b[0] @ w - 1.0) ** 2), jnp.zeros(2))
    solve(prob, optsolve.SGD(0.1), data=data, maxiters=10, progress=True)
    assert "10/10" in capsys.readouterr().err


def _counting_bar(monkeypatch):
    import tqdm.auto

    record = {"updates": 0, "total": None}

    class Counting(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            record["total"] = self.total

        def update(self, n=1):
            record["updates"] += 1
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Counting)
    return record


class _Loader:
    """A data loader: iterable again at every epoch, with a length, and not a list."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


@pytest.mark.parametrize("kind", ["loader", "list"])
def test_data_path_updates_the_bar_between_chunks_with_a_known_total(kind, monkeypatch, capsys):
    """On data the host moves the bar between compiled chunks, not the compiled steps: no
    host call stops them, and a run makes fewer than 100 updates (chunks of 32 batches
    here, whether the batches come from a list or a loader)."""
    record = _counting_bar(monkeypatch)
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(4, 2)),) for _ in range(50)]
    data = _Loader(batches) if kind == "loader" else batches
    prob = OptimizationProblem(lambda w, p, b: jnp.mean((b[0] @ w - 1.0) ** 2), jnp.zeros(2))
    sol = solve(prob, optsolve.SGD(0.01), data=data, epochs=20, progress=True)
    assert sol.stats.iterations == 1000
    assert record["total"] == 1000  # epochs x batches, with no maxiters
    assert 25 <= record["updates"] <= 40  # after each chunk but the last, and at the end
    assert "1000/1000" in capsys.readouterr().err


def test_in_memory_data_bar_total_is_epochs_times_batches(monkeypatch):
    record = _counting_bar(monkeypatch)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 2))
    prob = OptimizationProblem(lambda w, p, b: jnp.mean((b @ w - 1.0) ** 2), jnp.zeros(2))
    solve(prob, optsolve.SGD(0.01), data=x, batch_size=8, epochs=3, progress=True)
    assert record["total"] == 24


def test_adjoint_is_refused_when_training_on_data():
    prob = OptimizationProblem(lambda w, p, b: jnp.mean((b @ w - 1.0) ** 2), jnp.zeros(2))
    data = [np.ones((4, 2))] * 3
    import pytest

    # an iterable is fed by the host: no adjoint applies (in-memory data takes
    # UnrolledAdjoint, tests/backends/native/test_training_compiled.py)
    with pytest.raises(ValueError, match="an iterable of batches is fed by the host"):
        solve(prob, optsolve.SGD(0.01), data=data, adjoint=optsolve.UnrolledAdjoint())
