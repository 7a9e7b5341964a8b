"""The PyTorch wing: what each record of the JAX side is in PyTorch's terms, by the record's
name: the torch and timm classes or functions that compute the same (`optimizer_counterparts`,
`schedule_counterparts`, `loss_counterparts`, `clipping_counterparts`) and the names timm's and
torchvision's scripts give them. The DDP twin (`twin/`), the recipe translators and check
(`recipe/`), `--show_config` and the comparison read them; each op of an augmentation policy
against torchvision's (`compare_ops`). The loop and every layer below it never import the
wing. The counterparts import no torch (they are named, and built by those who import it);
the twin, the recipe check and `compare_ops` do."""
