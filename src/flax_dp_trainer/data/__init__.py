"""The input side: everything that reads data, and the only place that imports TensorFlow or
TFDS (the metric writers aside, whose CLU module imports TensorFlow itself). Three ideas,
three places: what a dataset is (`kinds/`), what one image goes through (`image/`), and the
stream of batches (the modules here).

    kinds/       what a dataset is, one module per kind (a TFDS dataset or a user's builder,
                 an image folder and its damaged files, arrays), each implementing one
                 protocol: its spec, splits, reads by index or in order, what it left out,
                 how it names an example (no TensorFlow at import); the converter
    image/       per-image processing, uint8 in, uint8 out: the preprocessing plans
                 (`image.preprocess`: what runs on one example, in order: decode, crop, flip,
                 RandAugment, erasing), RandAugment and random erasing (`image.augment`,
                 torchvision's definitions), the resize filters, scaled JPEG decode,
                 restart-segment crops, crop quality
    specs        what the trainer knows of a dataset before reading it (its kind's spec, or
                 a run's recorded one): classes, image shape, normalization, default
                 augmentation (no TensorFlow: the bare step and the DDP twin's synthetic
                 batches read it too)
    run_datasets a run's datasets resolved once: the options applied, every evaluation, what
                 the image folders leave out decided and recorded
    sources      read modes; the sources of examples by index (held in memory, ArrayRecord
                 records, image files) and a TFDS split in sequence (TFRecord files)
    stream       the global training stream: each epoch's order, the rows of each process,
                 the random streams drawn from (data seed, stream, position)
    damaged      an example that does not decode in training, named in one line
    image/       per-image processing, uint8 in, uint8 out: the preprocessing plans
                 (`image.preprocess`: what runs on one example, in order: decode, crop, flip,
                 RandAugment, erasing), RandAugment and random erasing (`image.augment`,
                 torchvision's definitions), the resize filters, scaled JPEG decode,
                 restart-segment crops, crop quality
    pipeline     the training batches of one process, and the evaluation batches
    datasets/    TFDS builders shipped with the trainer (`digits`)

Batches leave here as numpy uint8 images and int32 labels; the train and eval steps normalize
them on the device (`flax_dp_trainer.step.steps`), and Mixup/CutMix mixes the global batch there
(`flax_dp_trainer.step.mix`). A new augmentation is one `image.preprocess.Step` and its record in
`image.plan_steps` (when it is on, where, the fields it reads).
"""
