"""A PyTorch recipe (torchvision's or timm's `train.py` command line) as a config here, and
the check that both train alike: each script's arguments as its own parser reads them
(`torchvision_args`, `timm_args`), their translation into config fields (`from_torchvision`,
`from_timm`; the table and the config file: `translation`), the PyTorch side built from the
same arguments as the script builds it (`torchvision_side`, `timm_side`; one DDP iteration
in one process: `script_side`), the JAX side as training sets it up (`jax_side`), the
stages before the batch (the augmentation plan op by op: `plan_stage`; its draws:
`draws_stage`; the epoch's examples: `epoch_stage`), the settings compared
(`optimizer_settings`, `loss_settings`), the stages of one step compared (`stages`) and what
each means where it parts (`stage_causes`), and the check's run and verdict (`check`). Part
of the PyTorch wing: imports the twin (`pytorch.twin`: its Mixup/CutMix blend) and the
counterparts, and the layers below the wing; used by `tools.recipe`."""
