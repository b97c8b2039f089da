"""The command line: ``jobd run | validate | enqueue | status | dlq …`` (``main``)."""
