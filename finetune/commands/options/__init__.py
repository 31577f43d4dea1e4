"""Each subcommand's options, declared once: the parser and ``--help`` are generated from them."""
