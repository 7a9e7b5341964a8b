"""The loop's side concerns are listeners (`loop/listeners.py`): its body names none of them,
and the listeners are told in order, each phase entered and left by all of them. (A user's
listener through `fit`: tests/entry/test_api.py.)"""

import ast
import contextlib
import pathlib

from flax_dp_trainer.loop import listeners
from flax_dp_trainer.loop import session

# (JAX's StepTraceAnnotation stays: it names the step for any profiler, the user's too.)
SIDE_CONCERNS = ('timeline', 'throughput', 'efficiency', 'progress', 'bars', 'hook',
                 'writer', 'goodput', 'memory')


def _names(node: ast.AST) -> set[str]:
  found = set()
  for child in ast.walk(node):
    if isinstance(child, ast.Name):
      found.add(child.id)
    elif isinstance(child, ast.Attribute):
      found.add(child.attr)
  return found


def test_the_loop_body_names_no_side_concern():
  """`_Session.train`, the loop: no timeline, throughput, efficiency, progress bar, hook,
  writer or memory object; only its listeners' events."""
  tree = ast.parse(pathlib.Path(session.__file__).read_text(encoding='utf-8'))
  klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == '_Session')
  loop = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == 'train')
  names = _names(loop)
  assert {'on_step', 'on_evaluation', 'on_end', 'phase'} <= names  # (It reads the body.)
  assert [n for n in sorted(names) if any(c in n.lower() for c in SIDE_CONCERNS)] == []


class _Recorder(listeners.Listener):

  def __init__(self, name, told):
    self.name, self.told = name, told

  def on_log(self, step, scalars):
    self.told.append((self.name, 'log', step, dict(scalars)))
    scalars[self.name] = float(step)

  def measure(self, step):
    return {f'{self.name}_rate': step / 2}

  @contextlib.contextmanager
  def phase(self, name):
    self.told.append((self.name, 'enter', name))
    yield
    self.told.append((self.name, 'leave', name))


def test_listeners_are_told_in_order_and_see_what_those_before_added():
  told = []
  both = listeners.Listeners([_Recorder('a', told), _Recorder('b', told)])
  assert both.measure(4) == {'a_rate': 2.0, 'b_rate': 2.0}
  both.on_log(4, {'train_loss': 1.0})
  with both.phase('save'):
    told.append('inside')
  both.on_save(4)  # (Neither overrides it: the base does nothing.)
  assert told == [('a', 'log', 4, {'train_loss': 1.0}),
                  ('b', 'log', 4, {'train_loss': 1.0, 'a': 4.0}),
                  ('a', 'enter', 'save'), ('b', 'enter', 'save'), 'inside',
                  ('b', 'leave', 'save'), ('a', 'leave', 'save')]
