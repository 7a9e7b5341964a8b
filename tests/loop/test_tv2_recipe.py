"""torchvision's IMAGENET1K_V2 recipe (configs/imagenet_resnet50_tv2.py): every value of its
command shown by --show_config, and the recipe run end to end at a tiny size on an image
folder of generated JPEGs: TrivialAugmentWide, repeated augmentation x4, the training crop
apart from the evaluation's resize and crop, torchvision's EMA; a process's rows (of 2, of 8)
those of the same global batches, the same training on 4 and on 2 devices."""

import jax
import numpy as np
import pytest
from PIL import Image

from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer import configs
from flax_dp_trainer import settings
from flax_dp_trainer.configs import imagenet_resnet50_tv2
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import train
from flax_dp_trainer.runs import run_metrics
from tests import helpers

# torchvision's command and the script's defaults it leaves, as the config's fields hold them.
COMMAND = dict(
    model='resnet50', batch_size=1024, learning_rate=0.5, scale_learning_rate=False,
    optimizer='sgd', momentum=0.9, nesterov=False, lr_schedule='cosine',
    lr_schedule_unit='epoch', warmup_prefix=True, min_learning_rate=0.0, warmup_epochs=5.0,
    warmup_method='linear', warmup_start_factor=0.01, num_epochs=600.0, weight_decay=2e-5,
    decay_all_params=True, norm_weight_decay=0.0, label_smoothing=0.1, mixup_alpha=0.2,
    cutmix_alpha=1.0, mix_prob=1.0, mix_switch_prob=0.5, auto_augment='ta_wide',
    random_erase_prob=0.1, train_crop_size=176, eval_resize_size=232, eval_crop_size=224,
    image_size=224, resize_filter='antialias', aug_repeats=4, ema_decay=0.99998,
    ema_every_steps=32, ema_style='torchvision', grad_clip_norm=0.0, dtype='float32',
    augment='inception', dropout_rate=0.0)


def test_show_config_shows_every_value_of_the_command():
  """What `--config=imagenet_resnet50_tv2 --show_config` prints (`settings.show_config`)."""
  shown = settings.show_config(imagenet_resnet50_tv2.get_config(),
                               configs.path('imagenet_resnet50_tv2'), set())
  values = {line.split(' = ')[0]: line.split(' = ', 1)[1].split('  #')[0].strip()
            for line in shown.splitlines() if ' = ' in line and not line.startswith('#')}
  for field, value in COMMAND.items():
    assert values[field] == repr(value), (field, values[field], value)


@pytest.fixture(scope='module')
def jpeg_folder(tmp_path_factory):
  """RGB JPEGs of 3 classes, 16 train and 4 val images each, of sizes 60..92 pixels."""
  root = tmp_path_factory.mktemp('jpegs')
  rng = np.random.RandomState(0)
  for split, count in (('train', 16), ('val', 4)):
    for label, name in enumerate(('ant', 'bee', 'wasp')):
      (root / split / name).mkdir(parents=True)
      for i in range(count):
        height, width = 60 + 2 * i, 92 - 2 * i
        smooth = np.cumsum(rng.randint(-9, 10, (height, width, 3)), axis=0) + 50 * label
        pixels = np.clip(smooth + 80, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / split / name / f'{i}.jpg', quality=92)
  return str(root)


def _tiny(config, folder):
  """The recipe at a tiny size: the folder, crops of 48 (evaluation 64 -> 56), a tiny
  ResNet, batch 16 (4 examples x 4 copies), 3 epochs of 3 steps (the first the warm-up's,
  in which torchvision's EMA copies the model; it averages in the two after), EMA every 2
  steps."""
  config.update(dataset=f'folder:{folder}', eval_split='val', model='resnet_tiny',
                image_size=56, train_crop_size=48, eval_resize_size=64, eval_crop_size=56,
                batch_size=16, eval_batch_size=8, num_epochs=3.0, warmup_epochs=1.0,
                ema_every_steps=2, learning_rate=0.05, log_every_steps=3,
                eval_every_steps=9, checkpoint_every_steps=9, dtype='float32')
  return config


# Processes whose rows are checked against the global batches, by process count: the second
# of 2 (two runs of 4 copies from row 8), and of 8 (2 rows each) a middle one (the second half
# of a run of copies) and the last; process 0's rows start where the 1-process stream's do.
# Building a process's stream costs 3-4 CPU-s (the TrivialAugmentWide graph traced again):
# the 10 streams of every process were half the test.
CHECKED_PROCESSES = {2: (1,), 8: (3, 7)}


@pytest.mark.slow
def test_the_recipe_at_a_tiny_size_is_the_same_on_any_topology(jpeg_folder, tmp_path):
  """The stream's rows on 2 and 8 processes, and 9 steps trained on 4 and on 2 devices
  (they were 18: the same code, a warm-up epoch and two after it). Fails where a process
  reads another's rows or draws its augmentation from its own position in the stream (a
  process's rows differ from its slice of the global batch), where the runs of copies
  break, or where the devices change the training (batches' rows, BatchNorm's statistics,
  the EMA)."""
  config = _tiny(imagenet_resnet50_tv2.get_config(), jpeg_folder)
  options = run_options.data_options(config)
  datasets = run_datasets.resolve(options)
  assert (datasets.train.image_size, datasets.evals[0].spec.image_size,
          datasets.evals[0].spec.resize_size) == (48, 56, 64)
  data = pipeline.open_train_data(options, datasets.train)
  assert 'TrivialAugmentWide' in data.plan().describe()
  stream = data.batches()
  whole = [next(stream) for _ in range(3)]
  assert whole[0]['image'].shape == (16, 48, 48, 3)
  labels = whole[0]['label'].reshape(4, 4)
  assert (labels == labels[:, :1]).all()  # Runs of 4 copies.
  for count, checked in CHECKED_PROCESSES.items():
    # Each process builds its rows of the same global batches: process p the p-th slice.
    rows = 16 // count
    for p in checked:
      part = data.batches(process_index=p, process_count=count)
      for batch in whole:
        mine = next(part)
        for key in ('image', 'label'):
          np.testing.assert_array_equal(mine[key], batch[key][p * rows:(p + 1) * rows])
  states = {}
  for devices in (4, 2):
    workdir = str(tmp_path / f'd{devices}')
    states[devices] = train.train_and_evaluate(config, workdir,
                                               devices=jax.devices()[:devices])
    scalars, _ = run_metrics.read_events(workdir)
    assert {'eval_accuracy', 'eval_ema_accuracy'} <= set(scalars)
  saved = checkpointer.read_state(str(tmp_path / 'd4'))
  assert int(saved['step']) == 9
  for name in ('params', 'batch_stats', 'ema_params'):
    difference = helpers.relative_difference(getattr(states[2], name),
                                             jax.tree.leaves(getattr(states[4], name)))
    print(f'{name}: {difference:.2g} relative, 2 devices against 4')
    assert difference < 1e-5, (name, difference)
