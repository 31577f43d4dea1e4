"""The ``finetune`` subcommands as plain functions (train, evaluate, predict, bench); ``cli.py`` maps names to them."""
