"""The documentation's commands run, and its links resolve (README.md and docs/*.md).

The blocks are read from the pages when pytest collects this file, never copied here. A fenced
block runs when its info string says so (docs/tests.md, "Runnable blocks"):

  ```sh run              run in the slow tier, after the page's earlier `run` blocks
  ```sh run fast         run in the fast tier, on its own
  ```sh run status=2     expected to exit with status 2 (default 0)
  ```python run          run as a script
  ```python file=PATH    not run: written to PATH before the page's blocks run

Every block runs in a scratch folder of the test's own, not the checkout: a reader who installed
the package runs it from any folder. `/tmp` in its text stands for that folder, and
`/path/to/flax-dp-trainer` for the checkout (the launchers in `launch/` live there). `python`
there is a wrapper that shortens trainings: a command of `flax_dp_trainer`,
`flax_dp_trainer.tools.compare` or `flax_dp_trainer.pytorch.twin` with a `--config` gets
SHORT_RUN in place of its own durations (and `flax_dp_trainer.tools.compare` SHORT_COMPARE).
"""

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests import REPO
from tests import fork_server

DOCS = os.path.join(REPO, 'docs')
PAGES = ['README.md'] + sorted(
    f'docs/{name}' for name in os.listdir(DOCS) if name.endswith('.md'))
# Pages that describe code rather than commands, and the test suite's own page (its command is
# the suite, which cannot run inside itself): they need not open with a runnable block.
NOT_GUIDES = ('docs/architecture.md', 'docs/tests.md')

# What a training command of a runnable block trains instead of its own durations: a few steps,
# logged, evaluated and saved at the end.
SHORT_RUN = ('--config.num_train_steps=20', '--config.warmup_steps=2',
             '--config.log_every_steps=10')
SHORTENED_FIELDS = ('num_train_steps', 'num_epochs', 'warmup_steps', 'warmup_epochs',
                    'log_every_steps')
SHORTENED_MODULES = ('flax_dp_trainer', 'flax_dp_trainer.tools.compare',
                     'flax_dp_trainer.pytorch.twin')
# tools.compare times the log windows after its first steps (50 by default): a few, here.
SHORT_COMPARE = ('--timing_warmup_steps=5',)
LANGUAGES = {'sh': 'bash', 'bash': 'bash', 'python': 'python'}
BLOCK_TIMEOUT_S = 300
# The slow tier's pages run their commands through a fork server (tests/fork_server.py), which
# imports what the package's commands import once: the variable names its socket.
FORK_SERVER_VARIABLE = 'DOCS_FORK_SERVER'

_FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})\s*(.*)$')


@dataclasses.dataclass(frozen=True)
class Block:
  """One fenced block of a page."""
  page: str  # Relative to the repository, e.g. 'docs/data.md'.
  line: int  # The opening fence's line, from 1.
  language: str
  attributes: tuple[str, ...]  # The info string's words after the language.
  text: str

  @property
  def where(self) -> str:
    return f'{self.page}:{self.line}'

  @property
  def runs(self) -> bool:
    return 'run' in self.attributes

  @property
  def fast(self) -> bool:
    return 'fast' in self.attributes

  @property
  def status(self) -> int:
    values = [a.split('=', 1)[1] for a in self.attributes if a.startswith('status=')]
    return int(values[0]) if values else 0

  @property
  def file(self) -> str:
    values = [a.split('=', 1)[1] for a in self.attributes if a.startswith('file=')]
    return values[0] if values else ''


def parse_blocks(page: str, text: str) -> list[Block]:
  """The fenced blocks of a Markdown text, indented ones (in list items) included."""
  blocks, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    indent, fence, info = opening.groups()
    words = info.split()
    body, j = [], i + 1
    while j < len(lines) and not re.match(rf'^\s*{fence[0]}{{{len(fence)},}}\s*$', lines[j]):
      body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
      j += 1
    blocks.append(Block(page, i + 1, words[0] if words else '', tuple(words[1:]),
                        '\n'.join(body) + '\n'))
    i = j + 1
  return blocks


def _read(page: str) -> str:
  with open(os.path.join(REPO, page), encoding='utf-8') as f:
    return f.read()


BLOCKS = [block for page in PAGES for block in parse_blocks(page, _read(page))]
FAST = [block for block in BLOCKS if block.runs and block.fast]
SLOW_PAGES = sorted({block.page for block in BLOCKS if block.runs and not block.fast})


def localize(text: str, scratch: str) -> str:
  """A block's text as the test runs it: /tmp is the test's directory, the placeholder of the
  checkout is the repository."""
  # The repository's path goes in last: a clone may itself live under /tmp.
  text = re.sub(r'(?<![\w/.~-])/tmp(?![\w.-])', scratch, text)
  return text.replace('/path/to/flax-dp-trainer', REPO)


def _write_python_wrapper(directory) -> str:
  """`python` (and `python3`) for the blocks: this interpreter, with trainings shortened."""
  fields = '|'.join(f'--config.{name}=*' for name in SHORTENED_FIELDS)
  modules = '|'.join(SHORTENED_MODULES)
  script = f"""#!/usr/bin/env bash
# `python` for the documentation's runnable blocks (tests/package/test_docs.py): a training command
# trains the short run instead of its own durations.
real={shlex.quote(sys.executable)}
shorten=0
config=0
compare=0
for arg in "$@"; do
  case "$arg" in
    {modules}) shorten=1 ;;
    --config=*) config=1 ;;
  esac
  [[ "$arg" == flax_dp_trainer.tools.compare ]] && compare=1
done
# The page runs' fork server (tests/fork_server.py), where one serves: the command starts in a
# child of a process that imported the libraries once.
launch=("$real")
if [[ -n "${{{FORK_SERVER_VARIABLE}:-}}" ]]; then
  launch=("$real" -S -E {shlex.quote(fork_server.CLIENT)} "${{{FORK_SERVER_VARIABLE}}}" "$real")
fi
if [[ $shorten -eq 0 || $config -eq 0 ]]; then
  exec "${{launch[@]}}" "$@"
fi
args=()
for arg in "$@"; do
  case "$arg" in
    {fields}|--timing_warmup_steps=*) ;;
    *) args+=("$arg") ;;
  esac
done
if [[ $compare -eq 1 ]]; then
  args+=({' '.join(SHORT_COMPARE)})
fi
exec "${{launch[@]}}" "${{args[@]}}" {' '.join(SHORT_RUN)}
"""
  path = os.path.join(str(directory), 'python')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(script)
  os.chmod(path, 0o755)
  os.symlink(path, os.path.join(str(directory), 'python3'))
  return str(directory)


@pytest.fixture(scope='module')
def block_environment(tmp_path_factory, tfds_data_dir):
  """The environment of a reader's shell: the installed package (nothing of the checkout on
  PYTHONPATH), the wrapper first on PATH, and the session's TFDS data dir (digits is prepared
  there once)."""
  bin_dir = _write_python_wrapper(tmp_path_factory.mktemp('docs-bin'))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', TFDS_DATA_DIR=tfds_data_dir)
  env['PATH'] = os.pathsep.join([bin_dir, env.get('PATH', '')])
  env.pop('PYTHONPATH', None)
  return env


@pytest.fixture(scope='module')
def page_environment(block_environment):
  """`block_environment` with the fork server of the pages' commands: what a fresh
  interpreter would import before the command begins, imported once (the commands' results do
  not depend on it: each runs in a child of its own, with its own flags, working directory,
  environment and exit status)."""
  server = fork_server.Server(block_environment, fork_server.PRELOAD)
  try:
    yield dict(block_environment, **{FORK_SERVER_VARIABLE: server.path})
  finally:
    server.stop()


def _write_files(page: str, scratch: str) -> None:
  """The page's `file=PATH` blocks, where a reader would have saved them."""
  for block in BLOCKS:
    if block.page == page and block.file:
      path = os.path.join(scratch, localize(block.file, scratch))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as f:
        f.write(localize(block.text, scratch))


def _run_block(block: Block, scratch: str, env: dict) -> None:
  text = localize(block.text, scratch)
  if LANGUAGES[block.language] == 'python':
    script = os.path.join(scratch, f'block_line{block.line}.py')
    with open(script, 'w', encoding='utf-8') as f:
      f.write(text)
    python = ([sys.executable] if FORK_SERVER_VARIABLE not in env else
              fork_server.client(env[FORK_SERVER_VARIABLE]))
    command = [*python, script]
  else:
    command = ['bash', '-e', '-o', 'pipefail', '-c', text]
  # A session of its own, so that a timeout stops what the block started too.
  start = time.monotonic()
  process = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate()
    pytest.fail(f'{block.where}: still running after {BLOCK_TIMEOUT_S} s\n{text}\n'
                f'--- output, last 4000 characters ---\n{output[-4000:]}')
  print(f'{block.where}: {time.monotonic() - start:.1f} s')
  assert process.returncode == block.status, (
      f'{block.where}: exit status {process.returncode}, expected {block.status}\n{text}\n'
      f'--- output, last 4000 characters ---\n{output[-4000:]}')


@pytest.mark.parametrize('block', FAST, ids=[block.where for block in FAST])
def test_fast_block(block, block_environment, tmp_path):
  _write_files(block.page, str(tmp_path))
  _run_block(block, str(tmp_path), block_environment)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize('page', SLOW_PAGES)
def test_page_runs(page, page_environment, tmp_path):
  """The page's `run` blocks, in order, in one directory: a later block may use what an earlier
  one wrote (train, then load). Their commands start in the fork server's children."""
  _write_files(page, str(tmp_path))
  for block in BLOCKS:
    if block.page == page and block.runs and not block.fast:
      _run_block(block, str(tmp_path), page_environment)


def test_every_block_says_what_it_is():
  """An info string is a language and the convention's words: a misspelt `run` would leave a
  block untested without a word."""
  wrong = []
  for block in BLOCKS:
    for attribute in block.attributes:
      if not (attribute in ('run', 'fast') or re.fullmatch(r'status=\d+', attribute)
              or re.fullmatch(r'file=\S+', attribute)):
        wrong.append(f'{block.where}: unknown word {attribute!r} in the info string')
    if block.runs and LANGUAGES.get(block.language) is None:
      wrong.append(f'{block.where}: a `run` block in {block.language!r}, which does not run')
    if (block.fast or block.status) and not block.runs:
      wrong.append(f'{block.where}: `fast` and `status=` go with `run`')
    if block.file and block.runs:
      wrong.append(f'{block.where}: a block is either written (`file=`) or run')
  assert not wrong, '\n'.join(wrong)
  assert len([block for block in BLOCKS if block.runs]) >= 10


def test_every_guide_opens_with_a_block_that_runs():
  guides = [page for page in PAGES if page.startswith('docs/') and page not in NOT_GUIDES]
  assert guides
  for page in guides:
    first = next((block for block in BLOCKS if block.page == page and not block.file), None)
    assert first is not None and first.runs, f'{page}: its first block is not marked `run`'


def test_the_collector_reads_fences_and_their_words(monkeypatch):
  text = ('intro\n'
          '```sh run\n'
          'echo one \\\n'
          '    two\n'
          '```\n'
          '- a list item:\n'
          '  ```python file=/tmp/pkg/m.py\n'
          '  x = 1\n'
          '  ```\n'
          '~~~sh run fast status=2\n'
          'false\n'
          '~~~\n')
  blocks = parse_blocks('page.md', text)
  assert [(b.line, b.language, b.attributes) for b in blocks] == [
      (2, 'sh', ('run',)), (7, 'python', ('file=/tmp/pkg/m.py',)),
      (10, 'sh', ('run', 'fast', 'status=2'))]
  assert blocks[0].text == 'echo one \\\n    two\n'
  assert blocks[1].text == 'x = 1\n' and blocks[1].file == '/tmp/pkg/m.py'
  assert blocks[2].fast and blocks[2].status == 2
  assert localize('cd /tmp && ls /tmp/a "/tmp" /tmpx /x/tmp/y', '/S') == (
      'cd /S && ls /S/a "/S" /tmpx /x/tmp/y')
  # A checkout under /tmp (as CI's may be) keeps its path.
  monkeypatch.setattr(sys.modules[__name__], 'REPO', '/tmp/ci/repo')
  assert localize('/path/to/flax-dp-trainer/launch/local.sh --workdir=/tmp/w', '/S') == (
      '/tmp/ci/repo/launch/local.sh --workdir=/S/w')


def test_the_short_run_replaces_a_commands_durations(tmp_path):
  wrapper = _write_python_wrapper(tmp_path)
  show = 'import sys; print(" ".join(sys.argv[1:]))'
  argv = lambda *args: subprocess.run(
      [os.path.join(wrapper, 'python'), '-c', show, *args], capture_output=True, text=True,
      timeout=60, check=True).stdout.split()
  assert argv('-m', 'flax_dp_trainer', '--config=c.py', '--config.num_epochs=30',
              '--config.model=mlp', '--config.warmup_steps=10') == [
                  '-m', 'flax_dp_trainer', '--config=c.py', '--config.model=mlp', *SHORT_RUN]
  # No config file (--list), or another program: untouched.
  assert argv('-m', 'flax_dp_trainer', '--list=models') == [
      '-m', 'flax_dp_trainer', '--list=models']
  assert argv('-m', 'flax_dp_trainer.tools.compare', '--config=c.py',
              '--timing_warmup_steps=50') == [
      '-m', 'flax_dp_trainer.tools.compare', '--config=c.py', *SHORT_COMPARE, *SHORT_RUN]
  assert argv('-m', 'flax_dp_trainer.tools.export', '--config.num_train_steps=5') == [
      '-m', 'flax_dp_trainer.tools.export', '--config.num_train_steps=5']


# Links.


def _strip_inline_markup(text: str) -> str:
  text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)
  return re.sub(r'<[^>]+>|[`*]', '', text)


def github_slug(heading: str) -> str:
  """The anchor GitHub gives a heading: its text lowercased, punctuation but `-` and `_`
  dropped, each space a `-`."""
  text = _strip_inline_markup(heading).strip().lower()
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def _outside_fences(text: str) -> list[tuple[int, str]]:
  """(line number, line) of the lines outside fenced blocks."""
  kept, fence = [], None
  for number, line in enumerate(text.splitlines(), 1):
    opening = _FENCE.match(line)
    if fence is None and opening:
      fence = opening.group(2)
    elif fence is not None and re.match(rf'^\s*{fence[0]}{{{len(fence)},}}\s*$', line):
      fence = None
    elif fence is None:
      kept.append((number, line))
  return kept


def anchors(text: str) -> set[str]:
  found, seen = set(), {}
  for _, line in _outside_fences(text):
    heading = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
    if heading:
      slug = github_slug(heading.group(1))
      count = seen.get(slug, 0)
      seen[slug] = count + 1
      found.add(slug if count == 0 else f'{slug}-{count}')
    found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', line))
  return found


def links(text: str) -> list[tuple[int, str]]:
  """(line, target) of every inline and reference link outside code."""
  found = []
  for number, line in _outside_fences(text):
    line = re.sub(r'(`+).*?\1', '', line)  # Inline code.
    found += [(number, target) for target in
              re.findall(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)', line)]
    found += [(number, target) for target in re.findall(r'^\s*\[[^\]]+\]:\s*<?(\S+?)>?$', line)]
  return found


def test_every_relative_link_resolves():
  broken = []
  for page in PAGES:
    for number, target in links(_read(page)):
      if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):  # https:, mailto:
        continue
      path, _, anchor = target.partition('#')
      resolved = (os.path.normpath(os.path.join(os.path.dirname(page), path)) if path
                  else page)
      where = f'{page}:{number}: {target}'
      if not os.path.exists(os.path.join(REPO, resolved)):
        broken.append(f'{where}: no file {resolved}')
      elif anchor and resolved.endswith('.md') and anchor not in anchors(_read(resolved)):
        broken.append(f'{where}: no heading #{anchor} in {resolved}')
  assert not broken, '\n'.join(broken)


def test_the_slugs_are_githubs():
  text = ('# Resume, preemption and fine-tuning\n'
          '## What fits: `flax_dp_trainer.tools.bench_sharding`\n'
          "### The input pipeline against torchvision's DataLoader (current)\n"
          '```\n# not a heading\n```\n'
          '## Notes\n## Notes\n')
  assert anchors(text) == {
      'resume-preemption-and-fine-tuning', 'what-fits-flax_dp_trainertoolsbench_sharding',
      'the-input-pipeline-against-torchvisions-dataloader-current', 'notes', 'notes-1'}
