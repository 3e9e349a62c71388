"""The autoscaler, in one room: its pure decision core (core.py), the live controller's adapter (live.py: the
deployment spec's policy, the observation from the gateway's samples), the simulator's adapter (simulated.py)
and the fixed splits it is measured against (fixed_splits.py). Live and simulated runs ask the same core."""

# `trtpd simulate --autoscale`'s keys (simulated.load_policy): AutoscalePolicy's fields, per-role ones flat
# (min_prefill, max_decode, cost_prefill, ...); here so that the CLI's --help needs no simulator import
POLICY_KEYS = ("budget", "min_prefill", "min_decode", "max_prefill", "max_decode", "cost_prefill", "cost_decode",
               "cooldown_s", "scale_up_utilisation", "scale_down_utilisation", "mode", "interval_s", "window_s",
               "queue_time_share")
