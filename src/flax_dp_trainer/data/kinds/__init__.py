"""What a dataset is: one module per kind, each implementing `base.Kind` (its spec, its
splits, what it left out and why, how it describes itself) and `base.Reader` (its splits read
by index or in order, an example named). The rest of the input side holds a kind in its spec
(`DatasetSpec.kind`) and never asks which one it is.

    base           DatasetSpec, the two protocols, what every kind shares (stand-in splits)
    tfds_datasets  a TFDS dataset or a user's builder (`NAME`), the shipped ones (`digits`)
    folder         an image folder (`folder:PATH`), its files checked by `file_check`
    arrays         arrays from an .npz file (`npz:PATH`) or from Python (`arrays:NAME`)
    idx            MNIST-format files (`idx:DIR`), held as arrays
    left_out       the files a run leaves out, decided once and recorded in its workdir
    convert        a kind's records as ArrayRecord files (`tools.convert`)

No TensorFlow at import: a kind's reads import it where they run.
"""

from typing import Optional

from flax_dp_trainer.data.kinds import arrays
from flax_dp_trainer.data.kinds import base
from flax_dp_trainer.data.kinds import folder
from flax_dp_trainer.data.kinds import idx
from flax_dp_trainer.data.kinds import tfds_datasets


def of_name(name: str, given: Optional[arrays.Arrays] = None) -> base.Kind:
  """The dataset `name` (config.dataset) names: an image folder (`folder:PATH`), arrays
  (`npz:PATH`; `arrays:NAME`, the arrays `given` from Python), IDX files (`idx:DIR`), or a
  TFDS dataset."""
  if name.startswith(folder.PREFIX):
    return folder.FolderKind(name)
  if idx.is_idx(name):
    return idx.IdxKind(name)
  if given is not None and name == given.name:
    return arrays.ArraysKind(given)
  if arrays.is_arrays(name):
    return arrays.ArraysKind.of_name(name)
  return tfds_datasets.TfdsKind(name)


def of_spec(spec: base.DatasetSpec) -> base.Kind:
  """The kind `spec` holds; made again from its name where it holds none (a spec read back
  from JSON)."""
  return spec.kind if spec.kind is not None else of_name(spec.name)


def open_reader(options, spec: base.DatasetSpec, *, process_index: int = 0,
                split: Optional[str] = None) -> base.Reader:
  """A reader of the dataset of `spec` with its data in place; `split` (default the options'
  `train_split`) is the one it must read. `options`: the run's `DataOptions`."""
  return of_spec(spec).open(options, process_index=process_index,
                            split=split or options.train_split)


def listing() -> list[str]:
  """`--list=datasets`: the named datasets, then every kind's form of name."""
  return tfds_datasets.listing() + [folder.LISTED, arrays.LISTED, idx.LISTED]
