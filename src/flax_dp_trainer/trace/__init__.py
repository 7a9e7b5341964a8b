"""The trainer's model machinery that is not a model, below `zoo/` and `parallel/`: one trace
context that `model.adapter.Model.apply` sets around each apply (`context`: the remat policy
and the policies by name, FSDP's gathering, the example ids, BatchNorm groups, who asks for a
key, the marked calls counted), the blocks that read it (`remat`: `remat_block`, the gathered
params' name), per-example keys and masks (`per_example`), where a scanned stack's leaves lie
(`stacked`), and flax's scope patched for the probe and the port check alone (`scope_hooks`).
It may import `base` alone, and imports none of the package's other layers today."""
