"""Run in a subprocess with 4 host CPU devices: sharded solves equal unsharded ones and keep
their shardings. Prints one line 'OK <max difference>' on success."""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.config.update("jax_enable_x64", True)

import optsolve  # noqa: E402

assert len(jax.devices()) == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
data_sharding = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())

rng = np.random.default_rng(0)
features = rng.normal(size=(256, 8))
labels = (features @ rng.normal(size=8) > 0).astype(float)


def loss(w, p, batch):
    x, y = batch
    z = x @ w
    return jnp.mean(jnp.logaddexp(0.0, z) - y * z) + p * jnp.sum(w**2)


prob = optsolve.OptimizationProblem(loss, jnp.zeros(8), jnp.asarray(1e-3))
plain_batches = [(features[i : i + 64], labels[i : i + 64]) for i in range(0, 256, 64)]
sharded_batches = [jax.device_put(b, data_sharding) for b in plain_batches]
sharded_prob = prob.replace(x0=jax.device_put(prob.x0, replicated))

single = optsolve.solve(prob, optsolve.Adam(0.05), data=plain_batches, epochs=5)
sharded = optsolve.solve(sharded_prob, optsolve.Adam(0.05), data=sharded_batches, epochs=5)
diffs = [float(jnp.max(jnp.abs(single.x - sharded.x)))]
assert sharded.x.sharding.is_equivalent_to(replicated, 1), sharded.x.sharding

in_memory = jax.device_put((features, labels), data_sharding)
single_mem = optsolve.solve(
    prob, optsolve.SGD(0.1), data=(features, labels), batch_size=64, key=jax.random.key(0), epochs=3
)
sharded_mem = optsolve.solve(
    sharded_prob, optsolve.SGD(0.1), data=in_memory, batch_size=64, key=jax.random.key(0), epochs=3
)
diffs.append(float(jnp.max(jnp.abs(single_mem.x - sharded_mem.x))))

# a full-batch deterministic solve on sharded data
full = lambda w, p: loss(w, p, (features, labels))
sharded_data = jax.device_put((features, labels), data_sharding)
full_sharded = lambda w, p: loss(w, p, sharded_data)
a = optsolve.solve(
    optsolve.OptimizationProblem(full, prob.x0, prob.p), optsolve.Adam(0.05), maxiters=100
)
b = optsolve.solve(
    optsolve.OptimizationProblem(full_sharded, sharded_prob.x0, prob.p),
    optsolve.Adam(0.05),
    maxiters=100,
)
diffs.append(float(jnp.max(jnp.abs(a.x - b.x))))


# in-memory data inside one compiled program (jax.jit): the batches keep the samples'
# sharding, the parameters stay replicated and XLA reduces the gradients (an all-reduce
# in the compiled program); the result is the single-device one
def train(data, x0):
    return optsolve.solve(
        prob.replace(x0=x0),
        optsolve.Adam(0.05),
        data=data,
        batch_size=64,
        key=jax.random.key(0),
        epochs=3,
    ).x


single_jit = jax.jit(train)((features, labels), prob.x0)
sharded_jit = jax.jit(train)(in_memory, sharded_prob.x0)
assert sharded_jit.sharding.is_equivalent_to(replicated, 1), sharded_jit.sharding
diffs.append(float(jnp.max(jnp.abs(single_jit - sharded_jit))))
program = jax.jit(train).lower(in_memory, sharded_prob.x0).compile().as_text()
assert "all-reduce" in program, "no gradient reduction across devices"
print("OK", max(diffs))
sys.exit(0 if max(diffs) < 1e-12 else 1)
