"""``python -m sglang.srt.kernels [--portable NAME ...]``: build every native kernel for this CPU
into the cache now (an image build, CI while the rest of its packages install) rather than at
first use; with ``--portable``, also those kernels' portable variants. Says what it builds
(names, count, an estimate) before it starts and one line per finished kernel. Exits non-zero,
naming them, where a kernel did not build."""

from __future__ import annotations

import argparse
import functools
import sys

from sglang.srt import kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang.srt.kernels", description=__doc__)
    parser.add_argument("--portable", nargs="*", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    report = functools.partial(print, flush=True)
    wanted = len(kernels.kernel_names()) + len(args.portable)
    if not kernels.unbuilt(portable=args.portable):
        report(f"all {wanted} native CPU kernels are built in {kernels.cache_dir()}")
        return 0
    kernels.prebuild(portable=args.portable, report=report)
    if kernels.unbuilt(portable=args.portable):
        # once more: a build can fail on a passing cause (CI builds while pip installs the rest
        # of the packages; a compile that imported a module pip was replacing then failed)
        report("trying once more what did not build")
        kernels.prebuild(portable=args.portable, report=report)
    missing = kernels.unbuilt(portable=args.portable)
    if missing:
        print(f"not built: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
