"""A decode-side process for the KV integration tests: one pull, driven by one JSON line on stdin.

Input: {"key_hex", "handle_hex", "dst_block_ids", "num_blocks"}; it prints "layer N" as each layer lands in its
pool, then "done FIRST_TOKEN" (or "error TYPE: MESSAGE"). The tests kill it mid-pull.
"""

from __future__ import annotations

import json
import sys
import time

from trtpd.kv.handle import decode
from trtpd.kv.importer import KvImporter
from trtpd.kv.pool import KvPool


def main() -> None:
    args = json.loads(sys.stdin.readline())
    key, handle = bytes.fromhex(args["key_hex"]), bytes.fromhex(args["handle_hex"])
    params = decode(handle, key, time.time())
    importer = KvImporter(KvPool(params.layout, args["num_blocks"]), key)
    try:
        result = importer.pull(params, args["dst_block_ids"], on_layer=lambda layer: print(f"layer {layer}",
                                                                                             flush=True))
        print(f"done {result.first_token}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"error {type(e).__name__}: {e}", flush=True)
    finally:
        importer.close()


if __name__ == "__main__":
    main()
