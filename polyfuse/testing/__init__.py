"""``polyfuse.testing``: a differential fuzzer for the compiler.

Random te graphs (:mod:`.generate`) are compiled and run on the emulator, and their results are
compared against :func:`polyfuse.reference.evaluate` (:mod:`.run`); a failing graph is shrunk
to a minimal one (:mod:`.shrink`) and printed as a runnable script (:mod:`.script`).
``polyfuse fuzz --n N --seed S`` is the command line. :mod:`.torch_programs` fuzzes the
torch.compile backend with random PyTorch programs against eager (``polyfuse fuzz --torch``).
"""

from . import adversarial, conv, rows, stencil  # noqa: F401, E402 - register their families
