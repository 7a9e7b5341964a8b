"""The PyTorch wing: what each record of the JAX side is in PyTorch's terms, by the record's
name: the torch and timm classes or functions that compute the same (`optimizer_counterparts`,
`schedule_counterparts`, `loss_counterparts`, `clipping_counterparts`) and the names timm's and
torchvision's scripts give them. The DDP twin, the recipe translators, `--show_config` and the
comparison read them; the loop and every layer below it never import the wing. Imports no
torch: the counterparts are named, and built by those who import torch."""
