"""Serving: the real tritonserver binary, and the python-backend shells around trtpd's engines."""
