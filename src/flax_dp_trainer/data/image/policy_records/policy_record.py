"""A policy of config.auto_augment as one record (`Record`), found by its name, an alias or,
for a policy string, its first word (`find`), and a policy with its settings resolved
(`Policy`). No TensorFlow here: the config's checks read the records before it loads; a
record's `apply` imports what draws and applies it."""

import dataclasses
from typing import Any, Callable, Optional

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError

REGISTRY = registry.Registry('auto_augment')


@dataclasses.dataclass(frozen=True)
class Record:
  """One policy a user names with config.auto_augment."""
  name: str
  doc: str
  library: str  # Whose arithmetic and defaults: 'torchvision' or 'timm' (a config value).
  # (policy, uint8 [H, W, C] image, seed [2]) -> the image, every draw from the seed.
  apply: Callable[['Policy', Any, Any], Any]
  describe: Callable[['Policy'], str]  # What it is, as the run's preprocessing line says.
  interpolations: tuple[str, ...]  # What auto_augment_interpolation may be for it.
  default_interpolation: Callable[[Any], str]  # DataOptions -> its sampling where unset.
  default_fill: str = 'zeros'  # auto_augment_fill where unset: 'zeros' or 'mean'.
  reads: tuple[str, ...] = ()  # The config fields of its own parameters.
  params: Callable[[Any], tuple] = lambda options: ()  # DataOptions -> those parameters.
  aliases: tuple[str, ...] = ()  # Other names of it ('ra', the reference script's).
  # A policy string's first words ('rand' of 'rand-m9-mstd0.5'): the strings this record
  # reads; `validate` refuses what its grammar does not hold (ValueError, one line).
  kinds: tuple[str, ...] = ()
  validate: Callable[[str], Any] = lambda text: None
  examples: tuple[str, ...] = ()  # Strings the unknown-name line offers.
  # What it cannot take of the resolved settings: UserError, one line.
  check: Optional[Callable[['Policy'], None]] = None
  # (policy, seed [2], height, width) -> the ops it applies to a height x width image drawn
  # from the seed, in order: (op name, the value the library's op function takes; 0.0 where
  # it takes none). What the recipe check's draws count against the script's.
  events: Optional[Callable[['Policy', Any, int, int], list[tuple[str, float]]]] = None


@dataclasses.dataclass(frozen=True)
class Policy:
  """A policy with its settings resolved (`policy_choice.resolve`; `apply` applies it)."""
  name: str  # As config.auto_augment gives it.
  record: Record = dataclasses.field(repr=False, compare=False)
  interpolation: str = 'nearest'
  fill: Optional[tuple[float, ...]] = None  # None: zeros.
  params: tuple = ()  # The record's own parameters (`Record.params`).

  @property
  def library(self) -> str:
    return self.record.library

  def apply(self, image, seed):
    """The policy on a uint8 [H, W, C] image, drawn from `seed` (shape [2])."""
    return self.record.apply(self, image, seed)

  def events(self, seed, height: int, width: int) -> list[tuple[str, float]]:
    """The ops it applies to a `height` x `width` image drawn from `seed`, with their
    values (`Record.events`); NotImplementedError where its record has none."""
    if self.record.events is None:
      raise NotImplementedError(f'auto_augment={self.name!r} lists no draws')
    return self.record.events(self, seed, height, width)

  def describe(self) -> str:
    fill = 'zeros' if self.fill is None else f'fill {self.fill}'
    return f'{self.record.describe(self)}, {self.interpolation}, {fill}'


def find(name: str) -> Record:
  """The record of config.auto_augment `name`: by its name or an alias, else, for a policy
  string, by its first word; UserError in one line where none has it (the names and the
  strings' forms offered) or the string's grammar does not hold it."""
  for record in REGISTRY:
    if not record.examples and (name == record.name or name in record.aliases):
      return record
  for record in REGISTRY:
    if name.split('-')[0] in record.kinds:
      try:
        record.validate(name)
      except ValueError as e:
        raise UserError(f'auto_augment={name!r}: {e} (--config.auto_augment=NAME)') from None
      return record
  named = [n for record in REGISTRY if not record.examples
           for n in (record.name, *record.aliases)]
  examples = [e for record in REGISTRY for e in record.examples]
  raise UserError(f'auto_augment={name!r} is unknown; choose one of torchvision\'s '
                  f'policies, {", ".join(named)}, or a timm --aa string such as '
                  f'{", ".join(examples)} (--config.auto_augment=NAME)')
