"""Real text without a download: the Python standard library's own source files, as bytes (a byte-level corpus for
examples/train_gpt.py and examples/train_gpt_jax.py; numpy only, shared by both frontends).

The corpus: every `*.py` file under `sysconfig.get_paths()["stdlib"]`, sorted by relative path, skipping
`site-packages` and `test`/`tests` folders (so a machine's installed packages and the stdlib's own test data do not
change it). The held-out split is fixed by path: the files whose sorted index i satisfies i % HOLDOUT_EVERY == 0 go to
`heldout`, the rest to `train`; each split is its files' bytes joined by a NUL byte. Same Python, same split.
"""
import os
import sysconfig

import numpy as np

VOCAB = 256  # byte-level
HOLDOUT_EVERY = 20


def _sources(root: str) -> list:
    skip = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
    found = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if s not in skip)
        found += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return sorted(found)


def load(max_bytes: int = 0) -> tuple:
    """(train, heldout): uint8 arrays of the stdlib's source bytes (the split above). max_bytes > 0 stops reading
    once each split holds that many bytes (a `--tiny` run reads a few files, not the whole library)."""
    root = sysconfig.get_paths()["stdlib"]
    paths = _sources(root)
    if not paths:
        raise RuntimeError(f"stdlib_text: no *.py files under sysconfig's stdlib path {root!r}")
    parts = {"train": [], "heldout": []}
    sizes = {"train": 0, "heldout": 0}
    for i, rel in enumerate(paths):
        split = "heldout" if i % HOLDOUT_EVERY == 0 else "train"
        if max_bytes and sizes[split] >= max_bytes:
            if all(max_bytes and s >= max_bytes for s in sizes.values()):
                break
            continue
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read() + b"\0"
        parts[split].append(data)
        sizes[split] += len(data)
    join = lambda chunks, n: np.frombuffer(b"".join(chunks), np.uint8)[:n or None].copy()
    return join(parts["train"], max_bytes), join(parts["heldout"], max_bytes)


def batch(data: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator) -> tuple:
    """(inputs, targets), int64 [batch_size, seq_len] each: windows of `data` at offsets drawn from `rng`, targets
    shifted by one byte."""
    if len(data) <= seq_len + 1:
        raise ValueError(f"stdlib_text.batch: seq_len={seq_len} needs more than {seq_len + 1} bytes, the split holds "
                         f"{len(data)}")
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    window = data[idx].astype(np.int64)
    return window[:, :-1], window[:, 1:]
