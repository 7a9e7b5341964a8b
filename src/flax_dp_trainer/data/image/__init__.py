"""Per-image processing: what runs on one example, uint8 in, uint8 out.

    preprocess        the preprocessing plans: what runs on one example, in order (decode,
                      crop, flip, a policy, RandAugment, colour jitter, erasing)
    ops               torchvision's augmentation ops at a magnitude value
                      (`torchvision.transforms.v2`'s arithmetic), Invert among them
    policies          torchvision's policies: TrivialAugmentWide, AutoAugment (imagenet,
                      cifar10, svhn), drawn from a seed
    augmix            torchvision's AugMix, drawn from a seed
    augment           torchvision's RandAugment
    policy_strings    timm's --aa strings parsed as timm parses them (no TensorFlow)
    string_policies   timm's RandAugment, AugMix and AutoAugment, drawn from a seed
    pil_ops           PIL's arithmetic of timm's ops (enhancers, affine warps, bicubic a=-1)
    policy_choice     config.auto_augment as a policy with its reference's defaults (no
                      TensorFlow: the config's checks use it)
    auto_augment      a chosen policy applied to one image
    color_jitter      torchvision's ColorJitter (timm's --color-jitter)
    erasing           random erasing: torchvision's, timm's pixel mode and box count
    resize            the resize filters (`config.resize_filter`): decoded pixels resized, a
                      region resampled at a sub-pixel position
    scaled_decode     JPEG windows decoded at 1/2-1/8 scale where the output shrinks them 2x+
                      (`config.scaled_decode`)
    restart_segments  crops of JPEGs with restart markers decoded only where the window is
                      (`config.restart_skip`)
    crop_quality      what the crops look like against a Lanczos reference (PSNR, SSIM; the
                      quality figure of `bench.quality`)
    plan_draws        the training plan drawn outside the pipeline, as numpy (the crop's
                      windows, erasing's changes, outputs): the recipe check's draws
"""
