"""Flax variables <-> PyTorch state dicts: torchvision's ResNets and ViT, the baseline's twins.

`state_dict_keys(model, params)` names, for every flax layer, the torch module that holds the
same weights: `conv1`, `layer2.0.downsample.1`, `encoder.layers.encoder_layer_3.mlp.0`, ...
for the ResNets and ViTs (torchvision's names), `hidden.0`, `convs.1`, `out` for the `mlp`
and `cnn` twins of `pytorch/twin`. `to_state_dict` and `from_state_dict` convert the
arrays both ways (numpy; torch is needed only to read `.pth` files):

  Dense kernel (in, out)         <-> Linear weight (out, in)
  Conv kernel (H, W, in, out)    <-> Conv2d weight (out, in, H, W)
  BatchNorm scale, bias          <-> weight, bias; batch_stats mean, var <-> running_mean/var
  LayerNorm scale, bias          <-> weight, bias
  attention query/key/value      <-> in_proj_weight/bias (stacked q, k, v), out <-> out_proj
  ViT cls, pos_embedding         <-> class_token, encoder.pos_embedding

Nothing here imports the trainer.
"""

import math
import os
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from flax_dp_trainer.zoo import scanning
from flax_dp_trainer.zoo import resnet
from flax_dp_trainer.zoo import vit

Arrays = Dict[str, np.ndarray]
# Written by torch's BatchNorm beside its statistics; flax keeps no such counter.
_BN_COUNTER = 'num_batches_tracked'
# Where training scripts put the model's state dict inside a bigger checkpoint.
_NESTED_KEYS = ('state_dict', 'model', 'model_state_dict', 'module')
# timm's train.py saves its checkpoints as `model_best.pth.tar`, `checkpoint-N.pth.tar`.
WEIGHT_SUFFIXES = ('.pth', '.pt', '.bin', '.safetensors', '.pth.tar')
ENTRY_MARK = '#'  # FILE#ENTRY: the state dict under ENTRY of a checkpoint (`state_dict_ema`).


class WeightsMismatch(ValueError):
  """A state dict that does not fit the model; the message names the first mismatches."""


def _layers(tree: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
  """{'a': {'b': {'kernel': x}}} -> {'a/b': {'kernel': x}}: each layer's arrays by its path."""
  layers: Dict[str, Dict[str, Any]] = {}
  for path, value in traverse_util.flatten_dict(dict(tree), sep='/').items():
    layer, _, name = path.rpartition('/')
    layers.setdefault(layer, {})[name] = value
  return layers


def _resnet_keys(model: resnet.ResNet, layers: Iterable[str]) -> Dict[str, str]:
  names = {'conv_init': 'conv1', 'bn_init': 'bn1', 'Dense_0': 'fc'}
  block = model.block_cls.__name__
  convs = 3 if model.block_cls is resnet.BottleneckBlock else 2
  index = 0
  for stage, num_blocks in enumerate(model.stage_sizes):
    for b in range(num_blocks):
      flax_block, torch_block = f'{block}_{index}', f'layer{stage + 1}.{b}'
      for j in range(convs):
        names[f'{flax_block}/Conv_{j}'] = f'{torch_block}.conv{j + 1}'
        names[f'{flax_block}/BatchNorm_{j}'] = f'{torch_block}.bn{j + 1}'
      if f'{flax_block}/proj' in layers:
        names[f'{flax_block}/proj'] = f'{torch_block}.downsample.0'
        names[f'{flax_block}/BatchNorm_{convs}'] = f'{torch_block}.downsample.1'
      index += 1
  return names


def _vit_keys(model: vit.ViT) -> Dict[str, str]:
  names = {'embedding': 'conv_proj', 'encoder_norm': 'encoder.ln', 'head': 'heads.head'}
  for i in range(model.num_layers):
    flax_block, torch_block = f'encoderblock_{i}', f'encoder.layers.encoder_layer_{i}'
    names.update({f'{flax_block}/LayerNorm_0': f'{torch_block}.ln_1',
                  f'{flax_block}/MultiHeadDotProductAttention_0': f'{torch_block}.self_attention',
                  f'{flax_block}/LayerNorm_1': f'{torch_block}.ln_2',
                  f'{flax_block}/Dense_0': f'{torch_block}.mlp.0',
                  f'{flax_block}/Dense_1': f'{torch_block}.mlp.3'})
  return names


def _twin_keys(layers: Iterable[str]) -> Dict[str, str]:
  """The `mlp`/`cnn` twins: Dense_0.. hidden layers then `out`; Conv_i -> convs.i,
  BatchNorm_i -> norms.i."""
  convs = [name for name in layers if name.startswith('Conv_')]
  dense = sorted((name for name in layers if name.startswith('Dense_')),
                 key=lambda name: int(name.split('_')[1]))
  if convs:  # The CNN: convolutions (and BatchNorms), one hidden dense layer, the classifier.
    names = {name: f'convs.{name.split("_")[1]}' for name in convs}
    names.update({name: f'norms.{name.split("_")[1]}' for name in layers
                  if name.startswith('BatchNorm_')})
    names.update({dense[0]: 'hidden', dense[1]: 'out'})
    return names
  names = {name: f'hidden.{i}' for i, name in enumerate(dense[:-1])}  # The MLP.
  names[dense[-1]] = 'out'
  return names


def state_dict_keys(model: nn.Module, params: Mapping[str, Any]) -> Dict[str, str]:
  """flax layer path ('BasicBlock_3/Conv_1') -> torch module name ('layer2.1.conv2')."""
  layers = _layers(params)
  if isinstance(model, resnet.ResNet):
    return _resnet_keys(model, layers)
  if isinstance(model, vit.ViT):
    return _vit_keys(model)
  return _twin_keys(layers)


def _layer_to_torch(arrays: Mapping[str, Any], stats: Mapping[str, Any]) -> Arrays:
  """One flax layer's arrays as its torch module's state (names relative to the module)."""
  if 'kernel' in arrays:
    kernel = np.asarray(arrays['kernel'], np.float32)
    weight = kernel.T if kernel.ndim == 2 else kernel.transpose(3, 2, 0, 1)
    out = {'weight': weight}
    if 'bias' in arrays:
      out['bias'] = np.asarray(arrays['bias'], np.float32)
    return out
  out = {'weight': np.asarray(arrays['scale'], np.float32),
         'bias': np.asarray(arrays['bias'], np.float32)}
  if stats:  # BatchNorm.
    out.update(running_mean=np.asarray(stats['mean'], np.float32),
               running_var=np.asarray(stats['var'], np.float32),
               **{_BN_COUNTER: np.zeros((), np.int64)})
  return out


def _attention_to_torch(arrays: Mapping[str, Any]) -> Arrays:
  def dense(name):  # (in, heads, head_dim) -> Linear weight (heads * head_dim, in).
    kernel = np.asarray(arrays[name]['kernel'], np.float32)
    return kernel.reshape(kernel.shape[0], -1).T, np.asarray(arrays[name]['bias']).reshape(-1)
  q, k, v = (dense(name) for name in ('query', 'key', 'value'))
  out_kernel = np.asarray(arrays['out']['kernel'], np.float32)  # (heads, head_dim, out).
  return {'in_proj_weight': np.concatenate([q[0], k[0], v[0]]),
          'in_proj_bias': np.concatenate([q[1], k[1], v[1]]).astype(np.float32),
          'out_proj.weight': out_kernel.reshape(-1, out_kernel.shape[-1]).T,
          'out_proj.bias': np.asarray(arrays['out']['bias'], np.float32)}


def _modules(params: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
  """Layers by path, attention layers kept whole ({'query': {...}, ...})."""
  layers = _layers(params)
  merged: Dict[str, Dict[str, Any]] = {}
  for path, arrays in layers.items():
    parent, _, leaf = path.rpartition('/')
    if leaf in ('query', 'key', 'value', 'out') and parent.split('/')[-1].startswith(
        'MultiHeadDotProductAttention'):
      merged.setdefault(parent, {})[leaf] = arrays
    else:
      merged[path] = arrays
  return merged


def to_state_dict(model: nn.Module, variables: Mapping[str, Any]) -> Arrays:
  """The torch state dict (numpy arrays) holding `variables` ({'params', 'batch_stats'?});
  a scanned ViT's stacked blocks as torchvision's numbered layers."""
  params = scanning.unstack_layers(variables['params'])
  keys = state_dict_keys(model, params)
  stats = _layers(variables.get('batch_stats') or {})
  out: Arrays = {}
  for path, arrays in _modules(params).items():
    if path == '':  # Top-level params: the ViT's class token and position embedding.
      out['class_token'] = np.asarray(arrays['cls'], np.float32)
      out['encoder.pos_embedding'] = np.asarray(arrays['pos_embedding'], np.float32)
      continue
    if path not in keys:
      raise WeightsMismatch(f'flax layer {path!r} has no torch name')
    state = (_attention_to_torch(arrays) if 'query' in arrays
             else _layer_to_torch(arrays, stats.get(path, {})))
    out.update({f'{keys[path]}.{name}': value for name, value in state.items()})
  return out


def _mismatches(got: Mapping[str, np.ndarray], wanted: Mapping[str, np.ndarray],
                limit: int = 3) -> str:
  missing = [k for k in wanted if k not in got]
  extra = [k for k in got if k not in wanted]
  shapes = [f'{k} {tuple(got[k].shape)} where the model has {tuple(wanted[k].shape)}'
            for k in wanted if k in got and tuple(got[k].shape) != tuple(wanted[k].shape)]
  parts = []
  for what, items in (('missing', missing), ('unexpected', extra), ('shape', shapes)):
    if items:
      more = f' and {len(items) - limit} more' if len(items) > limit else ''
      parts.append(f'{what}: {", ".join(items[:limit])}{more}')
  return '; '.join(parts)


def _head_keys(model: nn.Module) -> Tuple[str, ...]:
  if isinstance(model, resnet.ResNet):
    return ('fc.weight', 'fc.bias')
  if isinstance(model, vit.ViT):
    return ('heads.head.weight', 'heads.head.bias')
  return ('out.weight', 'out.bias')


def _input_conv_key(model: nn.Module) -> Optional[str]:
  """The torch name of the convolution that takes the images (None for the twins)."""
  if isinstance(model, resnet.ResNet):
    return 'conv1.weight'
  if isinstance(model, vit.ViT):
    return 'conv_proj.weight'
  return None


def adapt_input_channels(weight: np.ndarray, channels: int) -> np.ndarray:
  """A first convolution's weight (out, in, H, W) for images of `channels` channels: summed
  over its input channels for one (a grey image is each colour channel at once), else its
  channels repeated to `channels` and scaled by in / channels (for a multiple of in, the
  response to an image whose channels are all alike is unchanged)."""
  given = weight.shape[1]
  if channels == 1:
    return weight.sum(axis=1, keepdims=True)
  repeated = np.tile(weight, (1, math.ceil(channels / given), 1, 1))[:, :channels]
  return repeated * np.asarray(given / channels, weight.dtype)


class FromTorch(NamedTuple):
  """What `from_state_dict` made of a state dict."""
  variables: Dict[str, Any]
  new_head: bool  # The classifier had another number of classes: kept from the template.
  adapted_input: Optional[Tuple[int, int]]  # (channels given, the model's) where the first
                                            # convolution was adapted; None otherwise.
  # (tokens given, the model's) where a ViT's position embedding was resampled to the
  # model's grid (fine-tuning at another image size); None otherwise.
  resampled: Optional[Tuple[int, int]] = None


def from_state_dict(model: nn.Module, variables: Mapping[str, Any],
                    state_dict: Mapping[str, Any],
                    pos_embedding_resize: str = 'bicubic') -> FromTorch:
  """`variables` (the model's, e.g. freshly initialized) with every array taken from the
  torch `state_dict` instead.

  A classifier whose number of classes differs is kept from `variables` (fine-tuning on
  another label set), and a first convolution made for images of other channels is adapted
  (`adapt_input_channels`); the result says which. Anything else that does not fit raises
  `WeightsMismatch` naming the first mismatches. A ViT's position embedding made for another
  image size is resampled to the model's grid (`vit.resample_pos_embedding` by
  `pos_embedding_resize`).
  """
  scanned = scanning.layer_form(_layers(variables['params'])) == 'scanned'
  variables = scanning.unstack_layers(dict(variables))
  template = to_state_dict(model, variables)
  given = {k[len('module.'):] if k.startswith('module.') else k: np.asarray(v)
           for k, v in state_dict.items() if not k.endswith(_BN_COUNTER)}
  template = {k: v for k, v in template.items() if not k.endswith(_BN_COUNTER)}
  head = _head_keys(model)
  reinit_head = all(k in given and k in template and given[k].shape[0] != template[k].shape[0]
                    and given[k].shape[1:] == template[k].shape[1:] for k in head)
  if reinit_head:
    given.update({k: template[k] for k in head})
  adapted = None
  first = _input_conv_key(model)
  if first in given and first in template:
    have, want = given[first].shape, template[first].shape
    if have[1] != want[1] and (have[0],) + have[2:] == (want[0],) + want[2:]:
      given[first] = adapt_input_channels(given[first], want[1])
      adapted = (have[1], want[1])
  resampled = None
  key = 'encoder.pos_embedding'
  if key in given and key in template and vit.can_resample(given[key].shape,
                                                           template[key].shape):
    resampled = (given[key].shape[1], template[key].shape[1])
    given[key] = vit.resample_pos_embedding(given[key], resampled[1], pos_embedding_resize)
  problem = _mismatches(given, template)
  if problem:
    raise WeightsMismatch(problem)
  params: Dict[str, Any] = {}
  stats: Dict[str, Any] = {}
  keys = state_dict_keys(model, variables['params'])
  template_stats = _layers(variables.get('batch_stats') or {})
  for path, arrays in _modules(variables['params']).items():
    if path == '':
      params.update(cls=given['class_token'], pos_embedding=given['encoder.pos_embedding'])
      continue
    prefix = keys[path] + '.'
    state = {k[len(prefix):]: v for k, v in given.items() if k.startswith(prefix)}
    if 'query' in arrays:
      layer = _attention_from_torch(arrays, state)
    else:
      layer = _layer_from_torch(arrays, state)
      if path in template_stats:
        stats[path] = {'mean': state['running_mean'], 'var': state['running_var']}
    params.update({f'{path}/{name}': value for name, value in
                   traverse_util.flatten_dict(layer, sep='/').items()})
  out = {'params': _like(params, variables['params'])}
  if variables.get('batch_stats') is not None:
    out['batch_stats'] = _like(
        {f'{path}/{name}': value for path, layer in stats.items() for name, value in
         layer.items()}, variables['batch_stats'])
  return FromTorch(scanning.stack_layers(out) if scanned else out, reinit_head, adapted,
                   resampled)


def _like(flat: Mapping[str, np.ndarray], template: Mapping[str, Any]) -> Dict[str, Any]:
  """The flat {'a/b/kernel': array} as a tree shaped and typed like `template`."""
  tree = traverse_util.unflatten_dict(dict(flat), sep='/')
  return jax.tree.map(lambda t, x: np.asarray(x, np.asarray(t).dtype).reshape(np.shape(t)),
                      dict(template), tree)


def _layer_from_torch(arrays: Mapping[str, Any], state: Mapping[str, np.ndarray]
                      ) -> Dict[str, np.ndarray]:
  if 'kernel' in arrays:
    weight = state['weight']
    out = {'kernel': weight.T if weight.ndim == 2 else weight.transpose(2, 3, 1, 0)}
    if 'bias' in arrays:
      out['bias'] = state['bias']
    return out
  return {'scale': state['weight'], 'bias': state['bias']}


def _attention_from_torch(arrays: Mapping[str, Any], state: Mapping[str, np.ndarray]
                          ) -> Dict[str, Dict[str, np.ndarray]]:
  width = state['in_proj_weight'].shape[0] // 3
  out = {}
  for i, name in enumerate(('query', 'key', 'value')):
    rows = slice(i * width, (i + 1) * width)
    out[name] = {'kernel': state['in_proj_weight'][rows].T,  # Reshaped to (in, heads, dim).
                 'bias': state['in_proj_bias'][rows]}
  out['out'] = {'kernel': state['out_proj.weight'].T, 'bias': state['out_proj.bias']}
  return out


def split_entry(path: str) -> tuple[str, str]:
  """'FILE#ENTRY' -> (FILE, ENTRY); a path without the mark: (path, '')."""
  if ENTRY_MARK in os.path.basename(path) and not os.path.exists(path):
    file, _, entry = path.rpartition(ENTRY_MARK)
    return file, entry
  return path, ''


def read_state_dict(path: str, taken: Optional[list] = None) -> Arrays:
  """The state dict in a `.safetensors` file or a `torch.save`d file (`.pth`, `.pt`, `.bin`,
  timm's `.pth.tar`), as numpy arrays; a checkpoint holding it under 'state_dict', 'model', ...
  is unwrapped, and `FILE#ENTRY` takes the one under ENTRY (timm's `state_dict_ema`). The keys
  unwrapped are appended to `taken`."""
  path, entry = split_entry(path)
  taken = [] if taken is None else taken
  if path.endswith('.safetensors'):
    # pylint: disable-next=import-outside-toplevel
    from safetensors import numpy as safetensors_numpy  # (optional: the ddp extra)
    return dict(safetensors_numpy.load_file(path))
  # (argparse, torch: timm's checkpoints hold a Namespace; torch is the ddp extra's.)
  import argparse  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel  # (optional: the ddp extra)
  # timm's checkpoints hold its arguments as a Namespace: allowed, nothing else is.
  with torch.serialization.safe_globals([argparse.Namespace]):
    saved = torch.load(path, map_location='cpu', weights_only=True)
  if entry:
    if not isinstance(saved, Mapping) or not isinstance(saved.get(entry), Mapping):
      have = [k for k, v in saved.items() if isinstance(v, Mapping)] if isinstance(
          saved, Mapping) else []
      raise WeightsMismatch(f'has no state dict under {entry!r}; it has {have or "none"}')
    saved = saved[entry]
    taken.append(entry)
  while isinstance(saved, Mapping) and not any(hasattr(v, 'shape') for v in saved.values()):
    nested = [k for k in _NESTED_KEYS if isinstance(saved.get(k), Mapping)]
    if not nested:
      break
    saved = saved[nested[0]]
    taken.append(nested[0])
  if not isinstance(saved, Mapping):
    raise WeightsMismatch(f'holds a {type(saved).__name__}, not a state dict')
  return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
          for k, v in saved.items() if hasattr(v, 'detach')}


def is_weights_file(path: str) -> bool:
  """Whether `init_from` names a PyTorch weights file, or an entry of one (else: a flax
  checkpoint)."""
  path = split_entry(path)[0]
  return os.path.isfile(path) and path.endswith(WEIGHT_SUFFIXES)


def write_state_dict(path: str, state_dict: Mapping[str, np.ndarray]) -> None:
  """Writes `state_dict` as `.safetensors` or, for any other suffix, with `torch.save`."""
  if path.endswith('.safetensors'):
    # pylint: disable-next=import-outside-toplevel
    from safetensors import numpy as safetensors_numpy  # (optional: the ddp extra)
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()},
                                path)
    return
  import torch  # pylint: disable=import-outside-toplevel  # (optional: the ddp extra)
  torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state_dict.items()}, path)
