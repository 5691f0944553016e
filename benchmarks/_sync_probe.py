"""Which ways of writing a value at index positions make a CUDA device wait for the host (run on a GPU):
each variant once under ``torch.cuda.set_sync_debug_mode("warn")``, its warnings counted.

    python benchmarks/_sync_probe.py
"""

from __future__ import annotations

import json
import warnings

import torch


def main() -> dict:
    device = torch.device("cuda")
    values = torch.zeros(64, 64, device=device)
    flags = torch.zeros(64, 64, dtype=torch.bool, device=device)
    rows = torch.arange(32, device=device)
    cols = (rows * 7) % 64
    variants = {
        "float setitem of a Python scalar": lambda: values.__setitem__((rows, cols), 0.5),
        "float index_put_ of a 0-dim device tensor": lambda: values.index_put_((rows, cols), torch.full((), 0.5, device=device)),
        "float index_put_ of new_full values": lambda: values.index_put_((rows, cols), values.new_full(rows.shape, 0.5)),
        "bool setitem of True": lambda: flags.__setitem__((rows, cols), True),
        "bool index_put_ of new_ones values": lambda: flags.index_put_((rows, cols), flags.new_ones(rows.shape)),
    }  # fmt: skip
    found = {}
    for name, run in variants.items():
        run()  # once before, so a first-call allocation is not counted
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            run()
            torch.cuda.set_sync_debug_mode("default")
        found[name] = sum("synchroniz" in str(w.message) for w in caught)
    print(json.dumps(found, indent=1))
    return found


if __name__ == "__main__":
    main()
