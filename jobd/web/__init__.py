"""What jobd serves over HTTP: Prometheus metrics and health (``metrics``), the HTTP server
itself with its limits and Host check (``server``), the dashboard (``dashboard``, its page in
``static/``) and the actions it takes for an operator (``actions``: requeue, purge, pause,
resume, cancel)."""
