"""The input side: everything that reads data, and the only place that imports TensorFlow or
TFDS (the metric writers aside, whose CLU module imports TensorFlow itself).

    specs        what the trainer knows of a dataset before reading it: classes, image shape,
                 normalization, default augmentation (no TensorFlow: the bare step and the
                 DDP twin's synthetic batches read it too)
    folder       image folders (ROOT/SPLIT/CLASS/*.jpg|jpeg|png) scanned into file lists
                 (no TensorFlow)
    file_check   every file of a folder checked before training: header and last bytes,
                 threads, a cache by (path, size, modification time) (no TensorFlow)
    damaged      files that do not read: left out (or refused) once and recorded in the
                 workdir; a decode failure in training named in one line
    sources      TFDS builders, splits and read modes; the reads by index (held in memory,
                 ArrayRecord records, image files) and in sequence (TFRecord files)
    stream       the global training stream: each epoch's order, the rows of each process,
                 the random streams drawn from (data seed, stream, position)
    preprocess   the preprocessing plans: what runs on one example, in order (decode, crop,
                 flip, RandAugment, erasing); uint8 in, uint8 out
    augment      RandAugment and random erasing (torchvision's definitions)
    pipeline     the training batches of one process, and the evaluation batches
    convert      `python -m flax_dp_trainer.tools.convert`: a TFDS dataset's or an image folder's
                 records as ArrayRecord files (read by index)
    datasets/    TFDS builders shipped with the trainer (`digits`)

Batches leave here as numpy uint8 images and int32 labels; the train and eval steps normalize
them on the device (`flax_dp_trainer.step.steps`), and Mixup/CutMix mixes the global batch there
(`flax_dp_trainer.step.mix`). A new augmentation is one `preprocess.Step` and one line in
`preprocess.train_plan`.
"""
