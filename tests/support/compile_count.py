"""Count XLA compilations, as optax's tests do, to assert that a second call does not recompile."""

import contextlib

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"
_count = [0]


def _listener(event, duration, **kwargs):
    if event == _EVENT:
        _count[0] += 1


jax.monitoring.register_event_duration_secs_listener(_listener)


class CompileCounter:
    """``with count_compilations() as c: ...; c.count`` is the number of compilations inside."""

    def __init__(self):
        self.start = _count[0]
        self.end = None

    @property
    def count(self) -> int:
        return (self.end if self.end is not None else _count[0]) - self.start


@contextlib.contextmanager
def count_compilations():
    counter = CompileCounter()
    try:
        yield counter
    finally:
        counter.end = _count[0]
