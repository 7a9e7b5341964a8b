"""What each stage of the recipe check means where it parts, in the config's fields and the
script's flags: the learning rate, the weight decay, the gradients (what feeds them) and
BatchNorm's grouping."""

from typing import Optional

from flax_dp_trainer.edge import checks


# Each script's flags that the causes name.
FLAGS = {
    'torchvision': dict(script='torchvision\'s script', smoothing='--label-smoothing',
                        clip='--clip-grad-norm', schedule='--lr-scheduler',
                        unit='the script steps its scheduler once an epoch'),
    'timm': dict(script='timm\'s train.py', smoothing='--smoothing', clip='--clip-grad',
                 schedule='--sched', unit='timm steps its scheduler once an epoch unless '
                 '--sched-on-updates'),
}


class Causes:
  """What each stage's difference means, in the config's fields and the script's flags."""

  def __init__(self, script: str, config, args, side, jax_decays: dict, torch_decays: dict):
    self.script, self.flags = script, FLAGS[script]
    self.config, self.args, self.side = config, args, side
    self.jax_decays, self.torch_decays = jax_decays, torch_decays

  def learning_rate(self, where: str, mine: Optional[dict] = None,
                    theirs: Optional[dict] = None) -> str:
    c, a = self.config, self.args
    on_updates = self.script == 'timm' and a.sched_on_updates
    hint = []
    epoch = self.side.iterations
    if c.steps_per_epoch != epoch and checks.counts_epochs(c):
      here = c.steps_per_epoch or 'the train split over batch_size'
      hint.append(f'--config.steps_per_epoch={epoch} ({self.flags["script"]} makes an epoch of '
                  f'{epoch} updates; here {here})')
    if c.lr_schedule_unit != ('step' if on_updates else 'epoch'):
      hint.append(f'--config.lr_schedule_unit={"step" if on_updates else "epoch"} '
                  f'({self.flags["unit"]})')
    hint += self._warmup_and_peak()
    values = (f' ({mine[where]:.6g} here, {theirs[where]:.6g} in the script)'
              if mine and theirs and where in mine and where in theirs else '')
    if not hint:
      return (f'the learning rate of {where} differs{values}: compare --config.learning_rate='
              f'{c.learning_rate:g}, lr_schedule={c.lr_schedule!r}, warmup_prefix='
              f'{c.warmup_prefix}, the warm-up\'s start and min_learning_rate with '
              f'{self.flags["schedule"]} and its flags (the translation\'s table)')
    return f'the learning rate of {where} differs{values}: set ' + '; '.join(hint)

  def _warmup_and_peak(self) -> list[str]:
    """The warm-up's length and the peak learning rate, each where it differs."""
    c, a = self.config, self.args
    out = []
    flag = '--lr-warmup-epochs' if self.script == 'torchvision' else '--warmup-epochs'
    theirs = float(getattr(a, flag[2:].replace('-', '_')))
    epoch = c.steps_per_epoch or self.side.iterations
    mine = c.warmup_epochs if c.warmup_epochs >= 0 else c.warmup_steps / epoch
    if abs(mine - theirs) > 1e-9:
      out.append(f'--config.warmup_epochs={theirs:g} (the warm-up is {mine:g} epochs here, '
                 f'{flag} {theirs:g} in the script)')
    peak = float(self.side.lr if self.script == 'timm' else a.lr)
    if not c.get('scale_learning_rate', False) and abs(c.learning_rate - peak) > 1e-6 * peak:
      out.append(f'--config.learning_rate={peak:g} (the script\'s peak; here '
                 f'{c.learning_rate:g})')
    return out

  def weight_decay(self, where: str) -> str:
    mine, theirs = self.jax_decays[where], self.torch_decays[where]
    a = self.args
    one_dim = self.side.model.get_parameter(where).ndim <= 1
    norm = self.script == 'torchvision' and a.norm_weight_decay is not None and \
        theirs == a.norm_weight_decay and one_dim and theirs != a.weight_decay
    flag = '--norm-weight-decay' if norm else '--weight-decay'
    if norm and self.config.norm_weight_decay != theirs:
      fix = f'--config.norm_weight_decay={theirs:g}'
    elif theirs > 0 and mine == 0 and one_dim and not self.config.decay_all_params:
      fix = '--config.decay_all_params=True'
    elif theirs == 0 and mine > 0 and one_dim and self.config.decay_all_params:
      fix = '--config.decay_all_params=False'
    else:
      fix = f'--config.wd_mults (a factor {theirs:g}/{self.config.weight_decay:g} for {where})'
    verb = lambda v: f'decayed at {v:g}' if v else 'spared'
    return (f'`{where}` is {verb(mine)} on the JAX side and {verb(theirs)} by '
            f'{self.flags["script"]} ({flag} {getattr(a, flag[2:].replace("-", "_"))}): set '
            f'{fix}')

  def gradients(self, where: str, criterion: str) -> str:
    """What feeds the gradients, where the forward pass and the loss are the same: the
    model's backward pass, the loss's gradient and BatchNorm's grouping (not the optimizer,
    which comes after)."""
    smoothing = self.flags['smoothing']
    value = getattr(self.args, smoothing[2:].replace('-', '_'))
    mine, theirs = self._groups()
    return (f'the gradients of `{where}` part where the forward pass and the loss are the same: '
            'what feeds them is the model\'s backward pass (python -m '
            f'flax_dp_trainer.tools.port_check on the two models names the layer), the loss\'s '
            f'gradient (the script\'s {criterion} with {smoothing} {value}: --config.loss, '
            f'label_smoothing) and BatchNorm\'s grouping ({mine} here, {theirs} in the '
            'script: --config.bn_group_size)')

  def _groups(self) -> tuple[str, str]:
    """What BatchNorm normalizes over, here and in the script."""
    c, a = self.config, self.args
    theirs = ('the global batch (--sync-bn)' if a.sync_bn else
              f'each GPU\'s {a.batch_size} examples (no --sync-bn), rank 0\'s statistics kept')
    mine = (f'groups of {c.bn_group_size} (bn_group_stats={c.bn_group_stats!r})'
            if c.get('bn_group_size', 0) else 'the whole global batch')
    return mine, theirs

  def batchnorm(self, where: str) -> str:
    a = self.args
    mine, theirs = self._groups()
    fix = ('--config.bn_group_size=0' if a.sync_bn else
           f'--config.bn_group_size={a.batch_size} --config.bn_group_stats=first')
    layer = where.rsplit('.', 1)[0] if where.endswith(('running_mean', 'running_var')) else where
    return (f'BatchNorm `{layer}` normalizes over {mine} here and over {theirs} in the '
            f'script: set {fix}')
