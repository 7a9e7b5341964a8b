"""A jaxlib CPU-client deadlock, shown without this project: many queued collective launches.

  python -m tests.xla_cpu_collective_deadlock --in_flight=0    # aborts within a minute
  python -m tests.xla_cpu_collective_deadlock --in_flight=8    # 20,000 steps, about 10 s

A pmapped step with two all-reduces (psum) on 8 simulated CPU devices is dispatched
`--steps` times. With nothing waited for (--in_flight=0), the Python loop runs ahead of the
devices; once about 30 launches are queued (jaxlib 0.10.2, 2-core x86-64 machine: 24 in
flight ran 20,000 steps, 32 and more hung at once), some devices never join an all-reduce
rendezvous, and after 40 s XLA logs

  F... rendezvous.cc:161] [id=N] Termination timeout for `all reduce RendezvousKey{...}` of
  40 seconds exceeded. Exiting to ensure a consistent program state. Expected 8 threads to
  join the rendezvous, but only 7 of them arrived on time.

and aborts the process (SIGABRT), the blocked thread being an AllReduceThunk run by
xla::cpu::ThunkExecutor on an Eigen pool worker. Waiting for the launch `--in_flight` steps
back before dispatching the next one (what trainer/dispatch.InFlight does) avoids it.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_integer('devices', 8, 'Simulated CPU devices.')
  flags.DEFINE_integer('steps', 20_000, 'Steps dispatched.')
  flags.DEFINE_integer('in_flight', 0, 'Launches queued at most before waiting for the '
                       'oldest; 0 = never wait (the deadlock).')


def step(w, x):
  h = jnp.tanh(x @ w)
  update = jax.lax.pmean(h.T @ x, 'i')
  loss = jax.lax.pmean(jnp.mean(h), 'i')
  return w - 0.01 * update.T, loss


def main(argv):
  del argv
  jax.config.update('jax_num_cpu_devices', FLAGS.devices)
  n = jax.local_device_count()
  p_step = jax.pmap(step, axis_name='i', donate_argnums=0)
  w = jax.pmap(lambda _: jnp.eye(64) * 0.1)(np.zeros(n))
  x = jax.pmap(lambda i: jax.random.normal(jax.random.PRNGKey(i), (32, 64)))(np.arange(n))
  pending, start = [], time.perf_counter()
  for i in range(FLAGS.steps):
    w, loss = p_step(w, x)
    pending.append(loss)
    if FLAGS.in_flight and len(pending) > FLAGS.in_flight:
      pending.pop(0).block_until_ready()
    if i % 1000 == 0:
      print(f'step {i} dispatched after {time.perf_counter() - start:.1f} s', flush=True)
  jax.block_until_ready(w)
  print(f'{FLAGS.steps} steps done in {time.perf_counter() - start:.1f} s')


if __name__ == '__main__':
  _define_flags()
  app.run(main)
