"""The tools users run, each `python -m flax_dp_trainer.tools.NAME` and a console script
`dp-NAME` (underscores as dashes):

    port_check        whether a flax port computes what its torch original computes, layer by
                      layer (docs/your_model.md)
    compare           the JAX trainer and the PyTorch DDP twin on the same global batches, a
                      report with plots (docs/ddp_comparison.md)
    export            a run's checkpoint as a torchvision state dict (docs/checkpoints.md)
    benchmark         the trainer against its bare step, the input pipeline, the DDP twin
                      (docs/benchmarks.md)
    bench_sharding    what fits per device under each state sharding, remat and scan
                      (docs/large_models.md)
    bench_file_check  the image folders' file check, files per second (docs/data.md)
    show_metrics      a run's metrics as a table
    convert           a TFDS dataset's or an image folder's records as ArrayRecord files
                      (docs/data.md)
    show_batch        the first training examples as the step receives them, and each op
                      of a policy beside torchvision's (docs/data.md)

What they share and run lives beside them: `bench/` (the benchmark's parts) and `runs/`
(starting programs, reading runs back, reports).
"""
