"""One module per ``kvspec`` subcommand.

Each module defines ``HELP`` (one line), ``configure(parser)`` and
``main(args) -> int``; ``kvspec.cli`` discovers them, so adding a command is
adding a file here.
"""
