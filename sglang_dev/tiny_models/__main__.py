"""``python -m sglang.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``."""

from sglang.tiny_models.build import main

main()
