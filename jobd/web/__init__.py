"""What jobd serves over HTTP: Prometheus metrics and health (``metrics``), the dashboard
(``dashboard``, its page in ``static/``)."""
