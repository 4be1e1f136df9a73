"""Byte-level language-modelling data that every machine already has.

* default: the text of the Python standard library's own ``.py`` files (this interpreter's), chosen
  deterministically (sorted paths, ``test``/``idlelib``/``site-packages`` trees skipped), read until
  ``max_bytes``; whole files go to validation in the order of a CRC32 of their relative path until they
  hold about ``val_fraction`` of the bytes, so the split is fixed and no file straddles it;
* ``path=FILE``: a user's own text (split at the byte position ``1 - val_fraction``);
* ``synthetic=true``: uniformly random token ids over the whole vocabulary (``vocab_size``: 128,256 for the
  Llama confs), for pure speed runs (no I/O, nothing to learn).

Batches are ``(x, y)`` LongTensors of shape (B, T) with ``y`` the input shifted by one byte.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}


def stdlib_dir() -> Path:
    """The directory of this interpreter's standard library (where ``os.py`` lives)."""
    return Path(os.__file__).resolve().parent


def stdlib_corpus(max_bytes: int, val_fraction: float = 0.1) -> tuple[bytes, bytes, int]:
    """(train bytes, validation bytes, number of files) from the standard library's ``.py`` files."""
    root = stdlib_dir()
    files = sorted(
        p for p in root.rglob("*.py")
        if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    if not files:
        raise FileNotFoundError(f"no .py files under the standard library directory {root}; "
                                "use data.path=FILE or data.synthetic=true")
    picked, total = [], 0
    for p in files:
        if total >= max_bytes:
            break
        text = p.read_bytes()[: max_bytes - total]
        picked.append((p.relative_to(root).as_posix(), text))
        total += len(text)
    # Validation: files taken in CRC32-of-path order until they hold ~val_fraction of the bytes (a file
    # that would overshoot twice the target is passed over); a fixed split, no file straddling it.
    target, val_bytes, is_val = val_fraction * total, 0, [False] * len(picked)
    for i in sorted(range(len(picked)), key=lambda i: zlib.crc32(picked[i][0].encode())):
        if val_bytes >= target:
            break
        n = len(picked[i][1])
        if val_bytes + n <= 2 * target:
            is_val[i], val_bytes = True, val_bytes + n
    if len(picked) > 1 and not any(is_val):  # every file too big for the target: the smallest one
        is_val[min(range(len(picked)), key=lambda i: len(picked[i][1]))] = True
    train = b"\n".join(t for (_, t), v in zip(picked, is_val) if not v)
    val = b"\n".join(t for (_, t), v in zip(picked, is_val) if v)
    return train, val, len(picked)


class _Chunks(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens from a 1-D uint8/long tensor: item i -> (x, y)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        return w[:-1], w[1:]


class _Random(Dataset):
    """``n`` fixed random sequences (generated once from ``seed``), for speed runs."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, :-1], self.data[i, 1:]


class ByteLMDataModule(L.LightningDataModule):
    """Byte-level LM data: the stdlib's source (default), ``path`` (a text file) or ``synthetic`` tokens."""

    def __init__(
        self,
        seq_len: int = 128,
        batch_size: int = 16,
        path: str | None = None,
        synthetic: bool = False,
        max_bytes: int = 4_000_000,
        val_fraction: float = 0.1,
        synthetic_samples: int = 1024,
        num_workers: int = 0,
        seed: int = 0,
        vocab_size: int = 256,
    ):
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got seq_len={seq_len}, batch_size={batch_size}")
        if path is not None and synthetic:
            raise ValueError("data.path and data.synthetic=true are exclusive: pick one")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        self.save_hyperparameters()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.description = ""

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.synthetic:
            n_val = max(hp.synthetic_samples // 8, 1)
            self.train_set = _Random(hp.synthetic_samples, hp.seq_len, hp.vocab_size, hp.seed)
            self.val_set = _Random(n_val, hp.seq_len, hp.vocab_size, hp.seed + 1)
            self.description = f"synthetic: {hp.synthetic_samples} random sequences over {hp.vocab_size:,} token ids"
            return
        if hp.path is not None:
            p = Path(hp.path).expanduser()
            if not p.is_file():
                raise FileNotFoundError(f"data.path={hp.path!r}: no such file")
            raw = p.read_bytes()[: hp.max_bytes]
            cut = int(len(raw) * (1 - hp.val_fraction))
            train, val = raw[:cut], raw[cut:]
            self.description = f"{p}: {len(raw):,} bytes"
        else:
            train, val, n_files = stdlib_corpus(hp.max_bytes, hp.val_fraction)
            self.description = f"Python stdlib ({stdlib_dir()}): {n_files} files, {len(train) + len(val):,} bytes"
        for name, buf in (("train", train), ("validation", val)):
            if len(buf) < hp.seq_len + 1:
                raise ValueError(
                    f"the {name} split has {len(buf)} bytes, fewer than seq_len + 1 = {hp.seq_len + 1}; "
                    "use more text (data.max_bytes, data.path) or a shorter sequence"
                )
        self.train_set = _Chunks(torch.frombuffer(bytearray(train), dtype=torch.uint8), hp.seq_len)
        self.val_set = _Chunks(torch.frombuffer(bytearray(val), dtype=torch.uint8), hp.seq_len)

    def _loader(self, ds: Dataset, shuffle: bool) -> DataLoader:
        hp = self.hparams
        return DataLoader(
            ds, batch_size=hp.batch_size, shuffle=shuffle, drop_last=shuffle, num_workers=hp.num_workers,
            pin_memory=torch.cuda.is_available(), persistent_workers=hp.num_workers > 0,
            generator=torch.Generator().manual_seed(hp.seed) if shuffle else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)
