"""The fine-tuning pipeline, in two layers.

The core, in the order a run uses it (`run.py` calls each stage):
    arguments.py, training_args.py  the options (dataclasses, YAML configs, the command line); inert
    hardware.py                     settings chosen from the machine (precision, compilation), an explicit step
    data/                           sources -> splits -> decoded cache -> `ImageSplit` batches (`load_image_data`)
    augment.py                      the batch transform on the device (crop, flip, RandAugment, erasing, mixing)
    models.py                       building and loading models, fine-tuning methods, parameter groups
    trainer.py                      the one place a training step is read: transform, mixing, loss, guard
    callbacks.py, nonfinite.py, compile.py   what acts around a step: clock, budget, EMA, signals; the non-finite
                                    guard; torch.compile that is never fatal
    checkpoints.py                  which checkpoint to resume (only a whole one), one run per output folder
    metrics/, results.py            evaluation metrics and the `results.json` schema
    run.py, cli.py, errors.py       the entry points and their one-line errors

The user tools around it, one command each (`vit-finetune COMMAND`), in tools/: predict, attention, compare and
report, hub (push) and model_card, export, quickstart.
"""
