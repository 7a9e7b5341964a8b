"""Default: the `cnn` model on the bundled `digits` dataset, data-parallel over local devices.

Trains offline (the dataset ships with the trainer) to about 0.98 test accuracy. Run it on 8
simulated CPU devices where there is no accelerator (accelerators are used when present):

  python -m flax_dp_trainer --config=default --workdir=/tmp/digits --cpu_devices=8
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  # Data.
  # Name: 'digits' (bundled, offline); any TFDS image classification dataset as TFDS names it
  # ('mnist', 'cifar10', 'imagenet2012', 'oxford_flowers102', 'eurosat/rgb', 'mnist:3.0.1';
  # --list=datasets); or an image folder 'folder:/PATH' holding PATH/train/CLASS/*.jpg|jpeg|png
  # and PATH/val/... (or the folder's ArrayRecord copy made by flax_dp_trainer.tools.convert).
  config.dataset = 'digits'
  # Modules imported before anything is built, comma-separated (e.g. 'my_data.shapes', a
  # package that registers a TFDS builder of your own, then named by `dataset`), from the
  # working directory or PYTHONPATH, on every process; '' = none.
  config.imports = ''
  # The dataset's spec as a run recorded it (WORKDIR/dataset_spec.json): taken as it is
  # instead of the dataset's metadata, on hosts without TensorFlow Datasets (the bare step's
  # benchmark, the DDP baseline on GPU hosts); '' = read the dataset's.
  config.dataset_spec = ''
  # TFDS data dir (path or gs://); '' = $TFDS_DATA_DIR or ~/tensorflow_datasets.
  config.tfds_data_dir = ''
  # Split names (TFDS slicing such as 'train[:90%]' allowed; for a folder, its subfolders).
  config.train_split = 'train'
  # Split evaluated, every example exactly once; a folder without test/ evaluates its val/
  # (or validation/), and says so.
  config.eval_split = 'test'
  # More evaluations at each eval step, comma-separated: 'SPLIT' of `dataset`, or
  # 'DATASET:SPLIT' of another dataset of the same classes (e.g. 'imagenet_v2:test'; DATASET
  # as `dataset` names it, the split after its last colon outside brackets). Tags:
  # eval_NAME_accuracy, eval_NAME_top5_accuracy, eval_NAME_loss, NAME the entry with each run
  # of other characters as '_' (e.g. eval_imagenet_v2_test_accuracy); '' = none.
  config.eval_splits = ''
  # Examples in each process's shuffle buffer; used only where the train split is read in
  # sequence (TFRecord files, cache=False): elsewhere each epoch is an index permutation.
  config.shuffle_buffer_size = 2048
  # Hold the train split in memory (decoded where its images share one size, else the encoded
  # files) and read it by index (the same global batches on any topology); False reads
  # ArrayRecord files (or a folder's image files) by index, else TFRecord files in sequence.
  config.cache = True
  # Image folders: a file that does not read (not an image, empty, truncated) is left out with
  # one warning line, and the list is recorded in WORKDIR/left_out_files.json so that every
  # resume leaves out the same files; False refuses the run, naming them (docs/data.md).
  config.skip_unreadable_files = True

  # Threads that read, decode and augment examples; 0 = every core this process may use.
  config.data_threads = 0

  # Augmentation of the training examples, drawn from the example's position in the training
  # stream: the same on any topology and on resume. `augment`: 'none', 'flip', 'crop_flip'
  # (pad 4 + random crop + flip, CIFAR) or 'inception' (random-resized crop to image_size +
  # flip, ImageNet; evaluation resizes and center-crops); '' = the dataset's own (docs/configs.md).
  config.augment = ''
  # Side of the square crop of augment='inception' (datasets whose images vary in size);
  # 0 = the dataset's (224 for ImageNet and image folders of varied sizes).
  config.image_size = 0
  # Resize every image whole to image_size x image_size (before `augment`, and for
  # evaluation): datasets of one size at another resolution, as fine-tuning CIFAR at 224 or
  # 384 does. False: image_size applies to augment='inception' only.
  config.resize_images = False
  # How augment='inception' resizes its crops (and evaluation its images): 'area' averages
  # when shrinking and interpolates bilinearly when enlarging; 'antialias' is torchvision's
  # bilinear filter with antialiasing (about 1.3-1.5x the CPU time per image); 'bicubic' is
  # Keys' cubic with antialiasing (PIL's bicubic, timm's --interpolation bicubic).
  config.resize_filter = 'area'
  # The training crop's filter alone (timm's --train-interpolation), one of resize_filter's;
  # '' = resize_filter.
  config.train_interpolation = ''
  # Train and test resolutions apart (FixRes; torchvision's --train-crop-size,
  # --val-resize-size, --val-crop-size), for augment='inception': the side of the training's
  # random-resized crop, the shorter side evaluation resizes to, and its center crop's side.
  # 0 = from image_size (the crop; evaluation resizes to the crop's side / 0.875).
  config.train_crop_size = 0
  # augment='inception''s crop, as torchvision's RandomResizedCrop (timm's --scale, --ratio):
  # the window's area as a fraction of the image's, drawn uniformly from low,high, and its
  # aspect ratio (width / height), drawn log-uniformly from low,high; numbers or fractions.
  config.crop_scale = '0.08,1.0'
  config.crop_ratio = '3/4,4/3'  # Its aspect ratio range, as crop_scale's comment says.
  # The probability of a horizontal flip (augment 'flip', 'crop_flip' and 'inception'; timm's
  # --hflip); 0 = none.
  config.hflip_prob = 0.5
  config.eval_resize_size = 0  # Evaluation's shorter side before the crop; 0 = crop / 0.875.
  config.eval_crop_size = 0  # Evaluation's center crop; 0 = image_size.
  # JPEGs whose crop (or, for evaluation, whole image) shrinks 2x or more are decoded at
  # 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling), the window's exact position kept: the same
  # windows and flips, a fraction of the decode's CPU time (docs/data.md). False: decoded whole.
  config.scaled_decode = True
  # The inception crop of a JPEG of 1 MP or more that carries restart markers (`jpegtran
  # -restart 1` adds them losslessly) entropy-decodes only the restart segments its window
  # needs: the same pixels, for folders of large photos with such markers (docs/data.md). Off
  # by default: the check costs some 7% of the CPU on ImageNet-sized JPEGs.
  config.restart_skip = False
  # Normalization of the images the model sees, per channel, comma-separated (one value for
  # all channels, or one each): (x - image_mean) / image_std, x on the [0, 1] scale of uint8
  # images (or the float images' own scale); '' = the dataset's (docs/data.md lists them; float
  # images are otherwise taken as they are).
  config.image_mean = ''
  config.image_std = ''  # Per channel, as image_mean; '' = the dataset's.
  # torchvision's RandAugment (auto_augment='randaugment', which chooses it): the ops applied
  # per image (its num_ops).
  config.randaugment_num_layers = 2
  config.randaugment_magnitude = 9  # RandAugment's magnitude bin, an integer in [0, 30].
  # An automatic augmentation policy; '' = none. torchvision's, as its reference script's
  # --auto-augment names them: 'ta_wide' (TrivialAugmentWide), 'imagenet', 'cifar10' or
  # 'svhn' (AutoAugment with that policy), 'augmix' (AugMix, the augmix_* fields),
  # 'randaugment' or 'ra' (RandAugment, the randaugment_* fields). timm's, as its --aa
  # strings: 'rand-m9-mstd0.5-inc1' (RandAugment: m magnitude, n ops, p probability, mstd
  # magnitude noise, inc increasing ops, mmax), 'augmix-m3-w3' (AugMix), 'original',
  # 'originalr', 'v0', 'v0r' (AutoAugment). docs/data.md has their ops and draws.
  config.auto_augment = ''
  # Their geometric ops' sampling: 'nearest', 'bilinear', 'bicubic' (timm's), 'random' (timm's:
  # bilinear or bicubic per op); '' = the policy's reference's: nearest for torchvision's
  # (bilinear for AugMix), timm's from train_interpolation ('bicubic' there: bicubic; else
  # random).
  config.auto_augment_interpolation = ''
  # Their geometric ops' fill: 'zeros', 'mean' (the dataset's mean pixel), or 0..255 values,
  # one or one per channel ('124,116,104'); '' = the policy's reference's: zeros for
  # torchvision's, the mean for timm's.
  config.auto_augment_fill = ''
  # torchvision's AugMix (auto_augment='augmix'): the ops' severity, 1..10 (their magnitude
  # bins drawn from 0..severity-1).
  config.augmix_severity = 3
  config.augmix_width = 3  # AugMix: the augmentation chains mixed.
  config.augmix_depth = -1  # AugMix: ops per chain; -1 = 1 to 3, drawn per chain.
  config.augmix_alpha = 1.0  # AugMix: the Dirichlet and Beta concentration of its weights.
  config.random_erase_prob = 0.0  # Probability of erasing a random box of an image; 0 = off.
  # What fills the box (timm's --remode): 'const' (the dataset's mean pixel; torchvision's
  # RandomErasing) or 'pixel' (per-pixel N(0, 1) noise on the normalized image, timm's: in
  # the train step, after mixing).
  config.random_erase_mode = 'const'
  # Boxes per erased image (timm's --recount), each of 1/count of the drawn area; 1 = one.
  config.random_erase_count = 1
  # Colour jitter (timm's --color-jitter): brightness, contrast and saturation factors drawn
  # from [1 - c, 1 + c] in a random order, as torchvision's ColorJitter; applied where no
  # auto_augment or RandAugment is set, as timm applies it; 0 = off.
  config.color_jitter = 0.0
  # Repeated augmentation (torchvision's --ra-reps, timm's --aug-repeats): each example
  # appears this many times in a row in the training stream, each copy augmented apart; an
  # epoch keeps its steps (1/aug_repeats of the distinct examples); a run of copies may go on
  # in the next process's rows or the next batch (any batch_size). 1 = off.
  config.aug_repeats = 1
  # Mixup/CutMix of the global batch (row r with row batch_size-1-r), soft targets in the loss.
  config.mixup_alpha = 0.0  # Mixup weight ~ Beta(alpha, alpha); 0 = no Mixup.
  config.cutmix_alpha = 0.0  # CutMix area ~ Beta(alpha, alpha); 0 = no CutMix.
  config.mix_prob = 1.0  # Probability that a batch is mixed (when an alpha is set).
  config.mix_switch_prob = 0.5  # With both alphas set: probability of CutMix over Mixup.

  # Model.
  # Registered model name (--list=models), or your own flax module by import path,
  # 'pkg.module:Name', imported from the working directory or PYTHONPATH (docs/your_model.md).
  config.model = 'cnn'
  # Constructor arguments of a model given by import path, one keyword argument a key: on the
  # command line --config.model_kwargs.width=64 (any key; the value a Python literal: 64,
  # 0.5, "(64, 128)", "'same'"; a bare word such as relu is that string), in a config file
  # config.model_kwargs = ml_collections.ConfigDict(dict(width=64)). Empty for registered
  # models, which take their settings from the fields of this config.
  config.model_kwargs = ml_collections.ConfigDict()
  # Where the model returns a dict: the entry that holds its logits. A model returning a tuple
  # gives its first element; one returning one array, that array (docs/your_model.md).
  config.model_logits = ''
  # The DDP baseline's PyTorch model when `model` is your own flax port of it: its import
  # path, 'pkg.module:Name' (a torch.nn.Module class or a function returning one); '' = the
  # baseline's twin of a registered model. --parity carries the flax init into it, layers
  # paired by call order (flax_dp_trainer.tools.port_check checks the pair first).
  config.torch_model = ''
  # Constructor arguments of `torch_model`, as `model_kwargs` are of `model`
  # (--config.torch_model_kwargs.img_size=8).
  config.torch_model_kwargs = ml_collections.ConfigDict()
  config.dropout_rate = 0.1  # Dropout probability in the model's hidden layers; 0 = off.
  # Rematerialization of each residual block (resnet*, vit*, and the blocks your module marks
  # with @flax_dp_trainer.remat_block): which activations the backward pass keeps, the rest
  # recomputed. 'none'; 'full' (recompute each block); 'dots' (keep matmul/conv outputs);
  # 'dots_no_batch' (keep those without a batch dimension). Results are those without.
  config.remat = 'none'
  # vit*: the encoder blocks as one nn.scan over params stacked along a layer axis, so that
  # the step compiles one block, not all (a 40-block model compiles in a fraction of the
  # time); the same results with dropout off. Checkpoints of either form load into the
  # other (resume, init_from, trainer.load, export).
  config.scan_layers = False
  # Stochastic depth (resnet*, vit*): probability of dropping the last residual block's branch
  # per example in training, rising linearly from 0 at the first block; 0 = off.
  config.stochastic_depth_rate = 0.0
  # BatchNorm's batch statistics in training over consecutive groups of this many examples of
  # the global batch, each normalized by its own group (PyTorch DDP without SyncBatchNorm, g =
  # the per-GPU batch); the same on any device count. 0 = the whole global batch.
  config.bn_group_size = 0
  # With bn_group_size > 0, what the running statistics move with: 'first' (group 0's, as
  # DDP's broadcast_buffers leaves rank 0's) or 'mean' (the mean of the groups', timm's
  # --dist-bn reduce).
  config.bn_group_stats = 'first'
  config.dtype = 'float32'  # Compute dtype: 'float32', 'bfloat16' or 'float16' (loss-scaled);
  # params and optimizer state stay float32.

  # Optimization (docs/configs.md#optimizers-and-schedules: each optimizer and schedule with
  # its torch/timm counterpart).
  # 'sgd', 'adam', 'adamw', 'nadamw', 'rmsprop', 'lion', 'lamb', 'lars', 'adafactor', 'muon',
  # or any optax optimizer by name: 'optax.NAME' / 'optax.contrib.NAME'.
  config.optimizer = 'sgd'
  # The optimizer's keyword arguments (--config.optimizer_kwargs.b2=0.95); a key that sets
  # what momentum, nesterov, adam_b1 or adam_b2 set wins over the field, with one line.
  config.optimizer_kwargs = ml_collections.ConfigDict()
  config.learning_rate = 0.1  # Peak learning rate, reached after warm-up.
  config.scale_learning_rate = False  # Multiply learning_rate by batch_size / 256.
  # Warm-up, then the schedule: in steps or in epochs of the train split. Set one of the two;
  # the other is -1. On the command line, the one given clears the other.
  config.warmup_steps = 30  # Steps of warm-up; -1 = use warmup_epochs.
  config.warmup_epochs = -1.0  # Warm-up in epochs of the train split; -1 = use warmup_steps.
  config.warmup_method = 'linear'  # 'linear' (torchvision's LinearLR) or 'constant'.
  # The warm-up starts at this fraction of the peak (torchvision's --lr-warmup-decay).
  config.warmup_start_factor = 0.0
  # timm's --warmup-lr: the warm-up starts at this rate instead; -1 = use warmup_start_factor.
  config.warmup_learning_rate = -1.0
  # True: the schedule's clock starts when the warm-up ends (torchvision's SequentialLR);
  # False: it counts from step 0 and the warm-up overrides its start (timm's default).
  config.warmup_prefix = True
  # 'cosine', 'constant', 'linear', 'step', 'multistep', 'exponential', 'poly', 'wsd' or
  # 'rsqrt' (timm's); docs/configs.md has each one's formula and reference.
  config.lr_schedule = 'cosine'
  # 'step': the rate changes every step (timm --sched-on-updates); 'epoch': held within an
  # epoch, as torchvision steps its scheduler and timm does by default.
  config.lr_schedule_unit = 'step'
  config.end_learning_rate_factor = 0.0  # Final learning rate as a fraction of the peak.
  # The final (minimum) learning rate itself (timm's --min-lr, torchvision's --lr-min); -1 =
  # end_learning_rate_factor x the peak.
  config.min_learning_rate = -1.0
  # multistep: the rate is multiplied by lr_gamma at each milestone, comma-separated, in
  # steps ('20,40') or in epochs (lr_milestone_epochs='30,60'): set one, the other ''.
  config.lr_milestones = ''
  config.lr_milestone_epochs = ''  # multistep's milestones in epochs; '' = lr_milestones.
  # step: the rate is multiplied by lr_gamma every lr_step_size steps or lr_step_size_epochs
  # epochs (torchvision --lr-step-size); set one, the other -1.
  config.lr_step_size = -1
  config.lr_step_size_epochs = -1.0  # step's interval in epochs; -1 = use lr_step_size.
  config.lr_gamma = 0.1  # step, multistep; exponential: the factor per step (or epoch).
  config.lr_power = 1.0  # poly's power; wsd's 'power' decay shape's.
  # wsd, rsqrt: the decay phase's length as a fraction of the schedule's (timm 0.2).
  config.lr_decay_fraction = 0.2
  config.lr_decay_shape = '1-sqrt'  # wsd: '1-sqrt', 'linear', 'cosine', 'power' or 'exp'.
  config.lr_rsqrt_timescale = 0  # rsqrt's timescale in steps; 0 = the warm-up's length.
  # timm's --cooldown-epochs: the run's last epochs held at the schedule's floor, the schedule
  # ending that much before the run (a schedule with a floor only); 0 = none.
  config.lr_cooldown_epochs = 0.0
  config.momentum = 0.9  # sgd, rmsprop, lars: momentum; 0 = none.
  config.nesterov = True  # sgd, lars: Nesterov momentum.
  config.adam_b1 = 0.9  # adam, adamw, nadamw, lamb: first-moment decay.
  config.adam_b2 = 0.999  # adam, adamw, nadamw, lamb: second-moment decay.
  # Weight decay; 0 = off. Coupled (added to the gradient) for sgd, adam, rmsprop and lars,
  # decoupled for adamw, nadamw, lion, lamb and muon, as their torch counterparts apply it.
  config.weight_decay = 5e-4
  # False: spare biases, norm params (1-D), position embeddings and class tokens from decay.
  config.decay_all_params = False
  # torchvision's --norm-weight-decay, --bias-weight-decay, --transformer-embedding-decay:
  # the decay of norm params, of biases, of position embeddings and class tokens; -1 = the
  # rule above.
  config.norm_weight_decay = -1.0
  config.bias_weight_decay = -1.0  # torchvision's --bias-weight-decay; -1 = the rule above.
  # torchvision's --transformer-embedding-decay; -1 = the rule above.
  config.embedding_weight_decay = -1.0
  # Per-parameter factors, 'REGEX=FACTOR,...' matched whole against '/'-joined param paths
  # (--show_param_groups lists them), the first match deciding (big_vision's lr_mults and
  # wd_mults); '' = none.
  config.lr_mults = ''
  config.wd_mults = ''  # Weight-decay factors, as lr_mults (e.g. 'head/.*=0').
  # Layer-wise learning-rate decay (timm's --layer-decay): block i of L trains at
  # layer_decay^(L - i) of the peak, the stem at layer_decay^(L + 1); 1 = off.
  config.layer_decay = 1.0
  # The blocks layer_decay counts: a regex matched at each param path's start, one block per
  # distinct match; '' = the model's repeated top-level modules (NAME_0, NAME_1, ...).
  config.layer_decay_blocks = ''
  # A regex of params not trained (matched whole): no update, no optimizer state; '' = none.
  # E.g. every param but the head: '(?!head/).*'.
  config.frozen = ''
  # Train in evaluation mode, as torch's model.eval() in a linear probe: BatchNorm uses and
  # keeps its running statistics; dropout and stochastic depth are off.
  config.frozen_batch_stats = False
  # Gradient clipping (timm's --clip-mode): 'norm' (the global norm to grad_clip_norm),
  # 'value' (each gradient to +-grad_clip_norm) or 'agc' (adaptive, grad_clip_norm the clip
  # factor, the head excluded as timm excludes it).
  config.grad_clip_mode = 'norm'
  config.grad_clip_norm = 0.0  # The clipping threshold of grad_clip_mode; 0 = no clipping.
  # Training (and eval_loss) loss: 'softmax_xent', 'sigmoid_xent' (per-class binary
  # cross-entropy summed over the classes, big_vision's; docs/your_model.md says how it scales
  # the learning rate), or 'bce' (timm's BinaryCrossEntropy, averaged over the classes).
  config.loss = 'softmax_xent'
  # loss='bce' only (timm's --bce-target-thresh): targets above it made 1, the rest 0; -1 =
  # the targets as they are.
  config.bce_target_threshold = -1.0
  config.bce_sum_classes = False  # loss='bce' only (--bce-sum): summed over the classes.
  config.bce_pos_weight = -1.0  # loss='bce' only (--bce-pos-weight): positives' weight; -1 = none.
  config.label_smoothing = 0.0  # Label smoothing of the training loss; 0 = off.
  config.grad_accum_steps = 1  # Micro-batches per step (their gradients are averaged).
  # Decay per update of an EMA of the params, evaluated beside them (eval_ema_*) and what
  # `load` and export take; 0 = no EMA. torchvision's --model-ema-decay is 0.99998.
  config.ema_decay = 0.0
  # Steps between updates of the EMA; 1 = after every step. torchvision's --model-ema-steps
  # is 32.
  config.ema_every_steps = 1
  # '' = a plain EMA: decay * average + (1 - decay) * params every ema_every_steps steps of the
  # run, from the initial params. 'torchvision' = its reference script's --model-ema: the
  # decay adjusted to batch_size x ema_every_steps / the run's epochs, updates counted within
  # each epoch, the average copied from the params in the warm-up epochs, BatchNorm
  # statistics averaged too (docs/configs.md). 'timm' = timm's --model-ema (ModelEmaV3):
  # the first update copies the params, BatchNorm statistics averaged too.
  config.ema_style = ''
  # ema_style='timm' only: timm's --model-ema-warmup, the decay of the update after k others
  # capped at 1 - (1 + k)^(-2/3).
  config.ema_warmup = False

  # Schedule. Steps count optimizer updates over the global batch.
  config.batch_size = 128  # Global training batch in examples, over all devices of all processes.
  config.eval_batch_size = 128  # Global evaluation batch in examples (last batch padded).
  # Training length in steps or in epochs, like the warm-up: set one, the other is -1.
  config.num_train_steps = 500  # Optimizer steps in total; -1 = use num_epochs.
  config.num_epochs = -1.0  # Training length in epochs of the train split; -1 = use steps.
  # The steps of an epoch for every field that counts epochs (num_epochs, warmup_epochs, the
  # 'epoch' unit, lr_*_epochs, the torchvision EMA); 0 = the train split over batch_size.
  # A PyTorch script's own count, where its loader keeps or drops each process's short last
  # batch (tools.recipe sets it); the data still runs through whole epochs of the split.
  config.steps_per_epoch = 0
  config.log_every_steps = 50  # Steps between writes of train metrics (one host sync each).
  config.eval_every_steps = 250  # Steps between evaluations; the last step always evaluates.
  config.checkpoint_every_steps = 250  # Steps between checkpoints; the last step always saves.
  # Also a checkpoint once this many seconds have passed since the last one, checked at log
  # steps (process 0 decides, every process saves); 0 = by steps only.
  config.checkpoint_every_seconds = 0.0
  config.keep_checkpoints = 3  # Newest checkpoints kept on disk.
  # Also the checkpoints of the keep_best best evaluations by best_metric (timm's
  # --checkpoint-hist with --eval-metric), kept beside the newest; every evaluation step
  # saves where it is set. 0 = none. A resume starts from the newest, never the best.
  config.keep_best = 0
  config.best_metric = 'eval_accuracy'  # An evaluation scalar's tag (metrics.jsonl's).
  # 'max' or 'min'; '' = by the name: ending in 'accuracy' is better higher, in 'loss' lower.
  config.best_mode = ''

  # Trackers beside TensorBoard, on process 0 (each an optional extra: pip install
  # 'flax_dp_trainer[wandb]', '[mlflow]'): the resolved config as the run's parameters, every
  # scalar at its step, tags; a resumed run continues the same tracked run.
  config.wandb_project = ''  # Weights & Biases project; '' = no W&B.
  config.wandb_entity = ''  # W&B entity (team or user); '' = the account's default.
  config.wandb_run_name = ''  # W&B run name; '' = W&B's own.
  # MLflow tracking URI ('' = no MLflow): a server (http://HOST:5000), or a local store as
  # sqlite:///PATH/mlflow.db.
  config.mlflow_tracking_uri = ''
  config.mlflow_experiment = ''  # MLflow experiment name; '' = the workdir's base name.
  # Initial params: a workdir or checkpoint of this trainer, or a PyTorch state dict file of
  # the same model in torchvision's names (.pth, .safetensors; a classifier of another size
  # is initialized afresh); '' = random init.
  config.init_from = ''
  # How a ViT position embedding of `init_from` made for another image size is resampled to
  # the model's grid (fine-tuning at a new resolution; the class token kept): 'bicubic' as
  # timm does, 'bilinear' as big_vision does.
  config.pos_embedding_resize = 'bicubic'
  config.skip_nonfinite_steps = False  # Skip NaN/Inf steps instead of stopping the run.
  # The flags of a script's command that this config, translated from it (tools.recipe),
  # does not follow, one line each ('--weights X: why'): a run logs them once at its start;
  # () = none (a config written by hand, or a whole translation).
  config.not_honoured = ()

  # Misc.
  config.seed = 0  # Seeds init, dropout and the data order.
  config.profile = False  # Capture a profiler trace of a few steps into the workdir.
  config.step_backend = 'pmap'  # 'pmap' or 'shard_map' (jax.jit + jax.shard_map): same step.
  # Where the state lives (shard_map only): 'replicated' (every device holds all of it),
  # 'optimizer' (optimizer state split over the devices: ZeRO-1), 'full' (params split too,
  # gathered whole for each step) or 'fsdp' (params, gradients and optimizer state split at
  # all times, each residual block gathering its params as it runs: docs/large_models.md).
  # The same training either way.
  config.state_sharding = 'replicated'
  # JAX's persistent compilation cache (path or gs://): a restart loads compiled steps from it
  # instead of compiling again; '' = off.
  config.compilation_cache_dir = ''

  config.lock()
  return config
