"""The command line: ``jobd run | validate | enqueue | status | dlq …`` (``main``), the
arguments each command takes (``arguments``), what ``status`` reports (``status``) and what
``dlq`` does (``dlq``)."""
