"""What a JAX-native run records and keeps besides its value and gradient norm, decided once
for every solver: the user's metrics at every iterate (``solve(..., metrics=fn)``, or aux
of a problem with ``has_aux``), an evaluation every k-th iterate (``evaluate=fn``,
``eval_every=k``), and the best iterate (``keep="best"``), all inside the compiled loop."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.native.objective import Objective, all_finite
from optsolve.backends.native.rules import INT, select
from optsolve.solve_api.options import SolveOptions

PyTree = Any


class Best(NamedTuple):
    """The iterate of lowest score so far, with what a Solution (and a resumed run) needs."""

    x: PyTree
    state: PyTree
    carried: tuple | None
    f: jax.Array
    score: jax.Array
    iteration: jax.Array


def score_of(evaluation: Any) -> jax.Array:
    """The score of ``evaluate``'s value: the value itself, or the first of ``(score, aux)``."""
    if isinstance(evaluation, (tuple, list)) and len(evaluation) == 2:
        evaluation = evaluation[0]
    if not hasattr(evaluation, "shape") or jnp.shape(evaluation) != ():
        raise TypeError(
            "solve: keep='best' ranks iterates by `evaluate`'s value, which must be a scalar "
            "score (lower is better) or a pair (score, aux); got "
            f"{jax.tree_util.tree_structure(evaluation)}."
        )
    return evaluation


def _as_float(tree: PyTree, default) -> PyTree:
    # ints and bools (counts, flags) become floats, so that NaN can stand for "not evaluated"
    return jax.tree_util.tree_map(
        lambda v: jnp.asarray(v).astype(
            v.dtype if jnp.issubdtype(jnp.asarray(v).dtype, jnp.inexact) else default
        ),
        tree,
    )


class Tracker:
    """The recording and keeping of one run, built at trace time from the options."""

    def __init__(self, options: SolveOptions):
        self.metrics = options.metrics if options.history else None
        self.evaluate = options.evaluate
        self.every = options.eval_every
        self.keep_best = options.keep == "best"
        self.records_evaluation = bool(options.history) and options.evaluate is not None

    def _evaluated(self, objective: Objective, x: PyTree, dtype) -> PyTree:
        return _as_float(lax.stop_gradient(objective.call(self.evaluate, x, batch=False)), dtype)

    def specs(self, objective: Objective, x: PyTree, dtype) -> tuple:
        """The shapes of one metrics value and one evaluation, as the record stores them
        (None for what is not recorded)."""
        metrics = (
            None
            if self.metrics is None
            else jax.eval_shape(lambda x: _as_float(objective.call(self.metrics, x), dtype), x)
        )
        evaluation = (
            None
            if not self.records_evaluation
            else jax.eval_shape(lambda x: self._evaluated(objective, x, dtype), x)
        )
        return metrics, evaluation

    def metrics_at(self, objective: Objective, x: PyTree, dtype) -> PyTree:
        if self.metrics is None:
            return None
        return _as_float(lax.stop_gradient(objective.call(self.metrics, x)), dtype)

    def due(self, iteration: jax.Array) -> jax.Array:
        return iteration % self.every == 0

    def evaluation_at(
        self, objective: Objective, x: PyTree, due: jax.Array, dtype
    ) -> tuple[PyTree, jax.Array | None]:
        """``evaluate(x, p)`` where ``due`` (NaN elsewhere, at no cost), and its score."""
        if self.evaluate is None:
            return None, None
        spec = jax.eval_shape(lambda x: self._evaluated(objective, x, dtype), x)
        nan = jax.tree_util.tree_map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), spec)
        value = lax.cond(due, lambda: self._evaluated(objective, x, dtype), lambda: nan)
        return value, score_of(value)

    def first_best(self, x: PyTree, state: PyTree, carried, dtype) -> Best | None:
        if not self.keep_best:
            return None
        return Best(
            x,
            state,
            carried,
            jnp.full((), jnp.nan, dtype),
            jnp.full((), jnp.inf, dtype),
            jnp.zeros((), INT),
        )

    def update_best(
        self,
        best: Best | None,
        ok: jax.Array,
        x,
        state,
        carried,
        f,
        score: jax.Array | None,
        iteration,
    ) -> Best | None:
        """``best``, or iterate ``iteration`` where its score (evaluate's, else f) is lower."""
        if best is None:
            return None
        score = (f if score is None else score).astype(best.score.dtype)
        better = ok & (score < best.score)  # a NaN score (not evaluated) is never better
        candidate = Best(
            x, state, carried, f.astype(best.f.dtype), score, jnp.asarray(iteration, INT)
        )
        # a conditional, not a select: most iterates are not the best
        return lax.cond(better, lambda: candidate, lambda: best)

    def final_best(
        self, best: Best | None, objective: Objective, x, state, carried, f, iteration
    ) -> Best | None:
        """``best`` with the run's final iterate as a candidate where it was not evaluated
        in the loop (a run on data ends with an update), scored by ``evaluate``."""
        if best is None or self.evaluate is None:
            return best
        ok = all_finite(x)
        _, score = self.evaluation_at(objective, x, ok, best.score.dtype)
        return self.update_best(best, ok, x, state, carried, f, score, iteration)

    def kept(self, best: Best | None, x, state, carried, f) -> tuple:
        """(x, state, carried, f) of the iterate the Solution returns."""
        if best is None:
            return x, state, carried, f
        found = jnp.isfinite(best.score)
        return select(
            found,
            (best.x, best.state, best.carried, best.f.astype(jnp.result_type(f))),
            (x, state, carried, f),
        )
