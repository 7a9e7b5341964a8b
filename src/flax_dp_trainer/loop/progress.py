"""Progress bars of a run watched from Python (`fit(..., progress=True)`, the default in a
notebook): one for the run's steps, with its latest metrics beside it, and one for each
evaluation's batches. tqdm's `auto` bars: a live widget in Jupyter (ipywidgets), text on a
terminal. Process 0 shows them; the log lines go on as they are."""

from typing import Iterable, Iterator, Optional

# The scalars shown beside the run's bar, where the run writes them, in this order.
SHOWN = ('train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy',
         'examples_per_sec_per_device')


def in_notebook() -> bool:
  """Whether this process is a Jupyter kernel (IPython with a kernel: a notebook, JupyterLab,
  Colab, VS Code's notebooks), where `fit` and `evaluate` show bars by default."""
  try:
    # (IPython is there only where a notebook or an IPython shell runs this process)
    from IPython import get_ipython  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  shell = get_ipython()
  return shell is not None and hasattr(shell, 'kernel')


def _short(tag: str, value: float) -> str:
  return f'{value:,.0f}' if tag.startswith('examples_') else f'{value:.4g}'


class Bars:
  """The bars of one run: `step` (a loop hook, called with each step dispatched) moves the
  run's bar, `scalars` (a writer callback) puts the latest metrics beside it, `evaluation`
  wraps an evaluation's batches in a bar of their own. `last`: the run's last step; `first`:
  the first step this session trains (None: no run bar, evaluations only)."""

  def __init__(self, last: int, first: Optional[int] = None):
    # (tqdm.auto looks for ipywidgets on import: only where bars are shown)
    from tqdm import auto  # pylint: disable=import-outside-toplevel
    self._tqdm = auto.tqdm
    self._latest: dict[str, float] = {}
    self._run = None
    if first is not None:
      self._run = self._tqdm(total=last, initial=min(first - 1, last), desc='train',
                             unit='step', dynamic_ncols=True)

  def step(self, step: int) -> None:
    if self._run is not None and step > self._run.n:
      self._run.update(step - self._run.n)

  def scalars(self, step: int, scalars: dict[str, float]) -> None:
    del step
    self._latest.update({tag: v for tag, v in scalars.items() if tag in SHOWN})
    if self._run is not None:
      self._run.set_postfix({tag: _short(tag, self._latest[tag])
                             for tag in SHOWN if tag in self._latest}, refresh=True)

  def evaluation(self, batches: Iterable, prefix: str, total: int) -> Iterator:
    """`batches` as they come, counted by a bar named `prefix` that goes when they end."""
    bar = self._tqdm(batches, total=total, desc=prefix, unit='batch', leave=False,
                     dynamic_ncols=True)
    try:
      yield from bar
    finally:
      bar.close()

  def close(self) -> None:
    if self._run is not None:
      self._run.close()

  def __enter__(self) -> 'Bars':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
