"""What a measurement costs: a partition's ``price_per_gpu_hour`` (the inventory's, in the team's currency) over
the tokens the run moved.

``cost_per_million_tokens`` = price x devices x 10^6 / dataset tokens per second / 3600: what a million dataset
tokens cost at the measured throughput, with every device of the run paid for the hour (a CPU partition's devices
are its worker processes). None without a price or a throughput.
"""

from __future__ import annotations


def cost_per_million_tokens(price_per_gpu_hour: float | None, devices: int | None,
                            dataset_tokens_per_second: float | None) -> float | None:
    if price_per_gpu_hour is None or not dataset_tokens_per_second or dataset_tokens_per_second <= 0:
        return None
    return price_per_gpu_hour * max(1, devices or 1) * 1e6 / dataset_tokens_per_second / 3600
