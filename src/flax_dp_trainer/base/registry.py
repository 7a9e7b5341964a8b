"""Records by name: a family (optimizers, schedules, ...) registers one record per name a user
can write, and every checker, builder, translator and table looks the name up here.

A user's module named in `config.imports` registers its own records the same way, before the
config is checked:

  from flax_dp_trainer.step import optimizers
  optimizers.REGISTRY.register(optimizers.Record(name='my_sgd', ...))

An unknown name is one line that lists the names and, where one is near, asks "did you mean".
"""

import difflib
import importlib
import pkgutil
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from flax_dp_trainer.base.errors import UserError

Record = TypeVar('Record')


class Registry(Generic[Record]):
  """The records of one family, by name, listed in the order of their names (whatever order
  their modules were imported in)."""

  def __init__(self, field: str):
    self.field = field  # The config field that names a record, e.g. 'optimizer'.
    self._records: dict[str, Record] = {}

  def register(self, record: Record) -> Record:
    """Adds `record` (its `name` attribute) and returns it; `ValueError` where the name is
    taken (a second module registering the same name would change what a config means)."""
    name = getattr(record, 'name')
    if not isinstance(name, str) or not name or name != name.strip():
      raise ValueError(f'{self.field}: a record needs a name, got {name!r}')
    if name in self._records:
      raise ValueError(f'{self.field}={name!r} is registered already; give yours another name')
    self._records[name] = record
    return record

  def __contains__(self, name: object) -> bool:
    return name in self._records

  def __iter__(self) -> Iterator[Record]:
    return iter([self._records[name] for name in self.names()])

  def names(self) -> list[str]:
    """The registered names, sorted."""
    return sorted(self._records)

  def by_alias(self, aliases: Callable[[Record], Iterable[str]]) -> dict[str, Record]:
    """{alias: its record} of the names `aliases(record)` gives each record: the names another
    script gives it (timm's --opt and --sched, torchvision's --lr-scheduler)."""
    return {alias: record for record in self for alias in aliases(record)}

  def near(self, name: str) -> str:
    """The registered name closest to `name` (case aside), or ''."""
    lowered = {n.lower(): n for n in self._records}
    close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else ''

  def unknown(self, name: str, others: str = '') -> UserError:
    """The one line for a name no record has: the near one, the names, the flag to set."""
    near = self.near(name)
    guess = f'did you mean {near!r}? ' if near else ''
    choices = ', '.join(self.names()) + (f' or {others}' if others else '')
    return UserError(f'{self.field}={name!r} is unknown; {guess}choose one of {choices} '
                     f'(--config.{self.field}=NAME)')

  def get(self, name: str, others: str = '') -> Record:
    """The record of `name`; `UserError` (`unknown`) where there is none. `others`: what the
    field also takes besides the names, for the line (e.g. "'optax.NAME'")."""
    if name not in self._records:
      raise self.unknown(name, others)
    return self._records[name]


def import_package(name: str, path: Iterable[str]) -> None:
  """Imports every module of the package `name` (its `__path__`, `path`): each shipped
  record's module registers it as it is imported, so a new record is its file alone."""
  for module in pkgutil.iter_modules(path):
    importlib.import_module(f'{name}.{module.name}')
