"""Where a params tree's leaves lie: the names along a key path, and whether a leaf lies in a
scanned stack (`SCANNED`: its first axis the layers), which FSDP's split axes and the
layer-by-layer views of the params read. The stacking itself is `zoo.scanning`'s."""

SCANNED = ('encoderblock',)  # The block names whose stacks this trainer knows.


def path_names(path) -> tuple:
  """The names along a pytree key path (dict keys, dataclass fields; None for indices)."""
  return tuple(getattr(k, 'key', getattr(k, 'name', None)) for k in path)


def is_stacked(path: tuple[str, ...]) -> bool:
  """Whether a leaf at `path` (names) lies in a scanned stack (its first axis the layers)."""
  return any(name in SCANNED for name in path)
