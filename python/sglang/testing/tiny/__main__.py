"""``python -m sglang.testing.tiny [--family F] [--out DIR] [--seed S] [--size S]``."""

from sglang.testing.tiny.build import main

main()
