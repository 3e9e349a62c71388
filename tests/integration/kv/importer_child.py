"""A decode-side process for the KV integration tests: one pull, driven by one JSON line on stdin.

Input: {"key_hex", "handle_hex", "dst_block_ids", "num_blocks"}; it prints "layer N" as each layer lands in its
pool, then "done FIRST_TOKEN" (or "error TYPE: MESSAGE") and "digest HEX" (block_digest of what it received).
The tests kill it mid-pull.
"""

from __future__ import annotations

import json
import sys
import time

import hashlib

import torch

from trtpd.kv.handle import decode
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool


def block_digest(pool_bytes: torch.Tensor, layout: KvLayout, block_ids: list[int], num_tokens: int) -> str:
    """sha256 of a request's valid tokens, block by block, from a pool's bytes viewed as
    [layers, blocks, 2, tokens_per_block, token bytes] (the tests compute it from the prefill pool's seed)."""
    digest = hashlib.sha256()
    for i, block_id in enumerate(block_ids):
        n = min(layout.tokens_per_block, num_tokens - i * layout.tokens_per_block)
        digest.update(pool_bytes[:, block_id, :, :n].contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = json.loads(sys.stdin.readline())
    key, handle = bytes.fromhex(args["key_hex"]), bytes.fromhex(args["handle_hex"])
    params = decode(handle, key, time.time())
    pool = KvPool(params.layout, args["num_blocks"])
    importer = KvImporter(pool, key)
    try:
        result = importer.pull(params, args["dst_block_ids"], on_layer=lambda layer: print(f"layer {layer}",
                                                                                             flush=True))
        print(f"done {result.first_token}", flush=True)
        layout = params.layout
        received = pool.data.view(torch.uint8).view(layout.num_layers, pool.num_blocks, 2, layout.tokens_per_block, -1)
        print(f"digest {block_digest(received, layout, args['dst_block_ids'], params.num_tokens)}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"error {type(e).__name__}: {e}", flush=True)
    finally:
        importer.close()


if __name__ == "__main__":
    main()
