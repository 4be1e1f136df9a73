"""Launch configuration of RoPE (ops/rope.py): data, read by its launchers only.

A program rotates every head of q and k at one (batch, position): the cos / sin row is read once for all of them.
Each entry says why.
"""

from __future__ import annotations

#: Elements of one head tile (BLOCK_H heads x BLOCK_D columns): 4,096 is 32 Llama-8B query heads of 128 in one tile
#: (the query's heads in one pass, the 8 key heads in a second), 16 float32 values a thread at 8 warps; the tile
#: is loaded twice (the columns and their rotation partners, the second mostly from L1).
TILE = 4096

#: Warps a program: 8 covers the 4,096-element tile in 16-byte vectors of bf16 with two per thread.
WARPS = 8
