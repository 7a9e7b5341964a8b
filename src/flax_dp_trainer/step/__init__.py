"""The pure per-device train and eval steps, Mixup/CutMix on the device, losses, metric
collections, the `TrainState` and its init, optimizers and schedules. Imports `base`,
`data` (the normalization only), `parallel`, `model` and `zoo`."""
