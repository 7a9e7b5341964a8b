"""The edge: where the config is read, once, above the loop. Its checks before anything
starts (`checks`; the augmentation fields': `augmentation_checks`; a setting that the run's
records do not read: `unread_fields`), durations in steps and the peak learning rate
(`durations`), each layer's typed options (`reading`), the experiment trackers the config
turns on (`trackers/`, one record each), the run prepared from the config (`prepare`) and
the ways in from Python (`train`: `train_and_evaluate`, `evaluate_only`). Imports the loop
and every library layer below it; nothing below it takes the config."""
