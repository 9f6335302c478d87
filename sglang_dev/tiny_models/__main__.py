"""``python -m sglang_dev.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``."""

from sglang_dev.tiny_models.build import main

main()
