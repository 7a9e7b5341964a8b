"""The augmentation fields of a config checked before anything is built or written: one line
each, naming the value and the fix. What depends on the dataset (a fill per channel, the
crop sizes against image_size) is checked where the dataset is resolved
(`data.run_datasets`, `data.image.policy_choice.resolve`)."""

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import data_options
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image import policy_records
from flax_dp_trainer.edge import reading as run_options


def _choice(field: str, value, choices) -> None:
  if value not in choices:
    raise UserError(f"{field}={value!r} is unknown; choose one of: {', '.join(choices)} "
                    f"(--config.{field}=NAME)")


def _whole(field: str, value, low: int, note: str = '') -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise UserError(f'{field}={value!r} must be a whole number >= {low}{note} '
                    f'(--config.{field}=N)')


def check(config) -> None:
  """Every augmentation field of `config`; UserError on the first that cannot run."""
  _check_randaugment(config)
  _check_policy(config)
  _check_policy_parameters(config)
  _check_erasing(config)
  _choice('resize_filter', config.resize_filter, specs.RESIZE_FILTERS)
  if config.train_interpolation:
    _choice('train_interpolation', config.train_interpolation, specs.RESIZE_FILTERS)
  if not config.color_jitter >= 0:
    raise UserError(f'color_jitter={config.color_jitter!r} must be >= 0; 0 turns it off '
                    '(--config.color_jitter=0.4)')
  if config.color_jitter and config.auto_augment:
    raise UserError(f'color_jitter={config.color_jitter} with the policy '
                    f'{config.auto_augment}: timm applies its color jitter only where no policy '
                    'is set; drop --config.color_jitter, or the policy')
  _check_crop(config)
  _whole('aug_repeats', config.aug_repeats, 1, '; 1 turns repeated augmentation off')


def _check_randaugment(config) -> None:
  """RandAugment's parameters' ranges."""
  layers, magnitude = config.randaugment_num_layers, config.randaugment_magnitude
  _whole('randaugment_num_layers', layers, 1, " (RandAugment's num_ops)")
  if not isinstance(magnitude, int) or not 0 <= magnitude <= specs.RANDAUGMENT_MAX_MAGNITUDE:
    raise UserError(f'randaugment_magnitude={magnitude!r} must be an integer in [0, '
                    f'{specs.RANDAUGMENT_MAX_MAGNITUDE}] (--config.randaugment_magnitude=M)')


def _check_policy_parameters(config) -> None:
  """A policy's own parameters (its record's `reads`: augmix_*, randaugment_*) set where the
  run's policy is another, or none, refused: one field, auto_augment, chooses the policy, and a
  value set is never ignored."""
  chosen = policy_records.find(config.auto_augment) if config.auto_augment else None
  defaults = data_options.DataOptions()
  for record in policy_records.REGISTRY:
    if record is chosen:
      continue
    for field in record.reads:
      if field in config and config[field] != getattr(defaults, field):
        policy = f'auto_augment={config.auto_augment!r}' if config.auto_augment else 'no policy'
        raise UserError(f"{field}={config[field]} is a parameter of {record.library}'s "
                        f'{record.doc}, and this run has {policy}; choose {record.doc} with '
                        f'--config.auto_augment={record.name}, or drop --config.{field}')


def _check_policy(config) -> None:
  """auto_augment and its settings (`policy_choice.resolve` with a stand-in dataset of three
  channels: the per-channel fill is checked again on the run's)."""
  if config.augmix_severity not in range(1, 11):
    raise UserError(f'augmix_severity={config.augmix_severity!r} must be an integer in '
                    "[1, 10], torchvision's AugMix range (--config.augmix_severity=3)")
  _whole('augmix_width', config.augmix_width, 1)
  if not isinstance(config.augmix_depth, int) or config.augmix_depth == 0 or (
      config.augmix_depth < -1):
    raise UserError(f'augmix_depth={config.augmix_depth!r} must be -1 (1 to 3 ops per chain '
                    'at random) or a whole number >= 1 (--config.augmix_depth=-1)')
  if not config.augmix_alpha > 0:
    raise UserError(f'augmix_alpha={config.augmix_alpha!r} must be > 0 '
                    '(--config.augmix_alpha=1.0)')
  fill = config.auto_augment_fill.strip()
  if config.auto_augment:
    policy_choice.resolve(run_options.data_options(config), 3, (0, 0, 0))
  elif config.auto_augment_interpolation or fill:
    field = 'auto_augment_interpolation' if config.auto_augment_interpolation else (
        'auto_augment_fill')
    raise UserError(f'{field}={config[field]!r} applies to a policy, and auto_augment is '
                    "''; set --config.auto_augment=NAME, or drop it")


def _check_erasing(config) -> None:
  _choice('random_erase_mode', config.random_erase_mode, specs.RANDOM_ERASE_MODES)
  _whole('random_erase_count', config.random_erase_count, 1)


def _check_crop(config) -> None:
  """The random-resized crop's ranges and the flip's probability; set where the run's
  augmentation has no crop or flip to take them, refused (a value set is never ignored)."""
  for field in ('crop_scale', 'crop_ratio'):
    data_options.crop_range(config[field], field)
  prob = config.hflip_prob
  if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob <= 1:
    raise UserError(f'hflip_prob={prob!r} must be a probability in [0, 1]; 0 turns the flip '
                    'off (--config.hflip_prob=0.5)')
