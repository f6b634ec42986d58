"""The optax optimizers as optsolve algorithm classes, generated from optax's own factories.

``ALGORITHMS`` maps each class name to its class; ``optsolve/__init__.py`` exports them.
Names follow optax's (``optax.adamw`` -> ``AdamW``); ``optax.lbfgs`` is ``OptaxLBFGS``
because ``LBFGS`` names optsolve's own JAX-native method.
"""

from __future__ import annotations

import optax
import optax.contrib

from optsolve.backends.optax.backend import OptaxAlgorithm, make_optax_algorithm

# Every top-level optax optimizer alias present in the installed optax.
_TOP_LEVEL = {
    "SGD": "sgd",
    "Adam": "adam",
    "AdamW": "adamw",
    "NAdam": "nadam",
    "NAdamW": "nadamw",
    "Adagrad": "adagrad",
    "Adadelta": "adadelta",
    "Adafactor": "adafactor",
    "Adamax": "adamax",
    "AdamaxW": "adamaxw",
    "AMSGrad": "amsgrad",
    "AdaBelief": "adabelief",
    "Adan": "adan",
    "Lamb": "lamb",
    "Lars": "lars",
    "Lion": "lion",
    "NoisySGD": "noisy_sgd",
    "NovoGrad": "novograd",
    "RAdam": "radam",
    "RMSProp": "rmsprop",
    "SM3": "sm3",
    "Yogi": "yogi",
    "Fromage": "fromage",
    "PolyakSGD": "polyak_sgd",
    "SignSGD": "sign_sgd",
    "Signum": "signum",
    "OptimisticGradientDescent": "optimistic_gradient_descent",
    "OptimisticAdam": "optimistic_adam",
    "OptimisticAdamV2": "optimistic_adam_v2",
    "Rprop": "rprop",
    "OptaxLBFGS": "lbfgs",
}

# Optimizers from optax.contrib that take a plain objective (no per-example gradients).
_CONTRIB = {
    "ACProp": "acprop",
    "AdEMAMix": "ademamix",
    "SimplifiedAdEMAMix": "simplified_ademamix",
    "ADOPT": "adopt",
    "COCOB": "cocob",
    "DAdaptAdamW": "dadapt_adamw",
    "DoG": "dog",
    "DoWG": "dowg",
    "MADGRAD": "madgrad",
    "Momo": "momo",
    "MomoAdam": "momo_adam",
    "Muon": "muon",
    "Prodigy": "prodigy",
    "ScheduleFreeAdamW": "schedule_free_adamw",
    "ScheduleFreeSGD": "schedule_free_sgd",
    "Sophia": "sophia",
}


def _generate() -> dict[str, type[OptaxAlgorithm]]:
    classes = {}
    for module, prefix, table in (
        (optax, "optax", _TOP_LEVEL),
        (optax.contrib, "optax.contrib", _CONTRIB),
    ):
        for class_name, factory_name in table.items():
            factory = getattr(module, factory_name, None)
            if factory is None:  # not in this optax version
                continue
            classes[class_name] = make_optax_algorithm(
                factory, class_name, f"{prefix}.{factory_name}"
            )
    return classes


ALGORITHMS: dict[str, type[OptaxAlgorithm]] = _generate()
# optax.lbfgs ends in a line search: its trial points would each change a model's state
ALGORITHMS["OptaxLBFGS"].threads_model_state = False  # its line search evaluates f at trials
ALGORITHMS["OptaxLBFGS"].takes_data = False  # ... and needs one deterministic objective
globals().update(ALGORITHMS)
__all__ = sorted(ALGORITHMS)
