"""Writes a run's trained model as a PyTorch state dict (torchvision's names; a port's, its
original's, `config.torch_model`), and says how to load it and what input it takes:

  python -m flax_dp_trainer.tools.export --workdir=/tmp/digits [--step=N|best] \\
      [--format=torchvision|safetensors] [--out=PATH]

`torchvision` writes a `torch.save` file (.pth), `safetensors` a .safetensors file; both hold
the variables `trainer.load` takes: the EMA's where the run kept one (those `eval_ema_*`
evaluated: its params, and its BatchNorm statistics where it averaged them), else the
params' (those of `eval_*`). ResNets and ViTs load into torchvision's own classes
(`torchvision.models.resnet50(num_classes=N)` for the ImageNet-shaped ones), the others into
the baseline's twin (`flax_dp_trainer.pytorch.twin.models.get`). The torch models take float32
NCHW images normalized as the trainer normalizes them; the lines printed say which. An
existing file is never overwritten. It needs torch, of the `ddp` extra (and safetensors for
--format=safetensors).
"""

import os

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer import inference
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import adapter
from flax_dp_trainer.zoo import torch_weights

FLAGS = flags.FLAGS
FORMATS = {'torchvision': '.pth', 'safetensors': '.safetensors'}
# Registered models that are torchvision's own constructors (ImageNet stem, 3 channels).
TORCHVISION = {'resnet18': 'resnet18', 'resnet34': 'resnet34', 'resnet50': 'resnet50',
               'resnet101': 'resnet101', 'vit_b16': 'vit_b_16'}


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, "The run's --workdir.", required=True)
  flags.DEFINE_string('step', None, "The checkpoint to export: a step number, or 'best' (the "
                      "best evaluation's, kept by --config.keep_best); default the newest.")
  flags.DEFINE_enum('format', 'torchvision', list(FORMATS), 'File format.')
  flags.DEFINE_string('out', None, 'Where to write (default: WORKDIR/export/MODEL_stepN.EXT).')


def torch_constructor(trained) -> str:
  """The Python expression that builds the torch model the state dict loads into."""
  name, spec = trained.config.model, trained.spec
  if trained.config.get('torch_model'):
    attribute = trained.config.torch_model.partition(':')[2]
    kwargs = dict(trained.config.torch_model_kwargs.to_dict(), num_classes=spec.num_classes)
    return (f'{attribute}(' + ', '.join(f'{k}={v!r}' for k, v in kwargs.items()) + ')')
  if name in TORCHVISION and spec.channels == 3 and (
      not name.startswith('vit') or tuple(spec.input_shape[:2]) == (224, 224)):
    return f'torchvision.models.{TORCHVISION[name]}(num_classes={spec.num_classes})'
  return (f'flax_dp_trainer.pytorch.twin.models.get({name!r}, input_shape={tuple(spec.input_shape)}, '
          f'num_classes={spec.num_classes})')


def _import_line(trained, file_format: str) -> str:
  """The imports the `load:` line uses (the constructor's module, the file's reader), so that
  it runs as printed, pasted into a fresh interpreter."""
  modules = ['safetensors.torch' if file_format == 'safetensors' else 'torch']
  if trained.config.get('torch_model'):
    module, _, attribute = trained.config.torch_model.partition(':')
    return f'import {", ".join(modules)}; from {module} import {attribute}; '
  function = torch_constructor(trained).partition('(')[0]
  modules.append(function.rpartition('.')[0])  # torchvision.models, or the twin's models.
  return f'import {", ".join(modules)}; '


def _port_state_dict(trained) -> dict:
  """A port's variables as a state dict of its original (`config.torch_model`), its layers
  paired by call order."""
  # pylint: disable=import-outside-toplevel  # (torch: for ports only)
  from flax_dp_trainer.port import call_order
  from flax_dp_trainer.port import originals
  from flax_dp_trainer.port import weights as port_weights
  # pylint: enable=import-outside-toplevel
  config, spec = trained.config, trained.spec
  original = originals.from_path(config.torch_model, config.torch_model_kwargs.to_dict(),
                                 spec.num_classes, 0.0)
  built = trained.built if trained.built is not None else adapter.wrap(trained.model)
  try:
    return port_weights.from_port(lambda v, im: built.apply(v, im, train=False),
                                  trained.variables, original, spec.input_shape)
  except call_order.PortMismatch as e:
    raise UserError(f'torch_model={config.torch_model!r} and model={config.model!r} do not '
                    f'pair up: {e} (nothing was written)') from None


def export(workdir: str, step, file_format: str, out) -> tuple[str, list[str]]:
  """Writes the state dict; returns its path and the lines that say how to use it."""
  trained = inference.load(workdir, step)
  out = out or os.path.join(workdir, 'export',
                            f'{trained.config.model.replace(":", "_")}_step{trained.step}'
                            f'{FORMATS[file_format]}')
  if os.path.exists(out):
    raise UserError(f'{out} exists; pass another --out (nothing was written)')
  if trained.config.get('torch_model'):
    state_dict = _port_state_dict(trained)
  else:
    state_dict = torch_weights.to_state_dict(trained.model, trained.variables)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  torch_weights.write_state_dict(out, state_dict)
  spec = trained.spec
  read = (f"safetensors.torch.load_file('{out}')" if file_format == 'safetensors'
          else f"torch.load('{out}')")
  lines = [
      f'wrote {out}: {trained.config.model} at step {trained.step}'
      f'{" (the EMA, as eval_ema_* evaluated it)" if trained.ema else ""}, '
      f'{len(state_dict)} tensors',
      f'load: {_import_line(trained, file_format)}model = {torch_constructor(trained)}; '
      f'model.load_state_dict({read}); model.eval()',
      f'input: float32 NCHW (N, {spec.channels}, {spec.input_shape[0]}, {spec.input_shape[1]}),'
      f' x / 255 less mean {tuple(spec.mean)}, over std {tuple(spec.std)}'
      + (f'; images resized and center-cropped to {spec.image_size} first'
         if spec.augment == 'inception' else
         f'; images resized to {spec.image_size}x{spec.image_size} first'
         if spec.image_size else '')]
  return out, lines


def main(argv):
  del argv
  if FLAGS.format == 'safetensors':  # (known once the flags are parsed; nothing is read yet)
    cli.require_ddp_extra(['safetensors'])
  try:
    _, lines = export(FLAGS.workdir, cli.checkpoint_step(FLAGS.step, '--step'), FLAGS.format,
                      FLAGS.out)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  print('\n'.join(lines))


def command() -> None:
  """`python -m flax_dp_trainer.tools.export` and the console script `dp-export`."""
  _define_flags()
  cli.run(main, needs=('torch',))


if __name__ == '__main__':
  command()
