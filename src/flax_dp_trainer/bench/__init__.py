"""The benchmark's parts (`tools.benchmark` runs each in its own process, `python -m
flax_dp_trainer.bench.NAME`): `limit` (the bare step), `ddp_limit` (the torch step under DDP),
`trainer` (the training loop, the compilation cache), `input` (the input pipeline against
torchvision's DataLoader), `quality` (what the crops look like), and what they share,
`common` and `memory` (peak memory, sampled from a process of its own). Internal: not for
users to run."""
