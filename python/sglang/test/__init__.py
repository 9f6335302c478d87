"""SGLang's test helpers (``sglang.test.test_utils``), ours, for SGLang's test kits and for
clients that launch a server through them (lmms-eval's ``srt_api``).

SGLang's kits themselves are not part of this package. Point ``SGLANG_TEST_KITS_DIR`` (one
folder, or several joined by ``os.pathsep``) at a copy of the ``sglang/test/`` folder of an
SGLang wheel and ``sglang.test.kits.*``, ``sglang.test.vlm_utils``, ... import from there, while
the modules of this folder (``test_utils`` above all) keep precedence over the wheel's own.
"""

import os

for _folder in os.environ.get("SGLANG_TEST_KITS_DIR", "").split(os.pathsep):
    if _folder and _folder not in __path__:
        __path__.append(_folder)
