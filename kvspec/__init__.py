"""kvspec: the command-line layer over reference/, spec/, engine_adapter/ and fuzz/."""
