"""flax_dp_trainer: a Flax data-parallel trainer. One train step over a device axis
(`jax.pmap`, or `jax.jit` with `shard_map`) with the gradients averaged by `lax.pmean`, fed the
global batches of a training stream that depends on the config, the seed and the step alone.

From the command line (`--list=configs` names the shipped configs):

    python -m flax_dp_trainer --config=default --workdir=/tmp/digits

From Python (a script or a notebook):

    import flax_dp_trainer as fdt
    from flax_dp_trainer.configs import default

    config = default.get_config()
    result = fdt.fit(config, '/tmp/run', model=MyNet(num_classes=10), loss=my_loss,
                     cpu_devices=8)     # .state, .step, .history (to plot)
    fdt.evaluate(config, '/tmp/run', model=MyNet(num_classes=10))
    trained = fdt.load('/tmp/run')       # .predict(images), .logits(images)

`fit` and `evaluate` are `api`'s, `load` is `inference`'s; `remat_block` (`trace.remat`)
marks a block of your model that `config.remat` recomputes; a `Listener`
(`loop.listeners`), passed to `fit(listeners=[...])`, is told of the loop's events
(`ScalarsListener(f)` calls `f(step, scalars)` with each log's and evaluation's scalars).
Every `import flax_dp_trainer.X` runs this file first, so it imports nothing: these names load
when first used (PEP 562), and `import flax_dp_trainer.X` pulls in neither JAX nor TensorFlow
that X does not need.
"""

import importlib as _importlib

__version__ = '0.2.0'

# Name: the module that defines it.
_EXPORTS = {'fit': 'api', 'evaluate': 'api', 'load': 'inference',
            'remat_block': 'trace.remat', 'Listener': 'loop.listeners',
            'ScalarsListener': 'loop.listeners'}

__all__ = ['__version__', *_EXPORTS]


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(_importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
  globals()[name] = value  # Later look-ups find it without this function.
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *_EXPORTS} - {'_importlib'})
