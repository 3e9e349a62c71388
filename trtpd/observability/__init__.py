"""Observability for fleets: Prometheus scrape config and launcher (prometheus.py); the alert rules and the
Grafana dashboard live in configs/prometheus/ and configs/grafana/."""
