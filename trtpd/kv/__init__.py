"""KV-cache layout, pools and the transfer between prefill and decode instances."""
