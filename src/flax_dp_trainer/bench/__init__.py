"""The benchmark's parts (`tools.benchmark` runs each in its own process, `python -m
flax_dp_trainer.bench.NAME`): `limit` (the bare step), `ddp_limit` (the torch step under DDP),
`trainer` (the training loop, the compilation cache), `input` (the input pipeline against
torchvision's DataLoader), and what they share, `common`. Internal: not for users to run."""
