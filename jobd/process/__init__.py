"""The handler process: starting it (``spawn``; never past its lease: ``deadline``), its
environment, its life (``handler``), and what its end means for the job (``policy``)."""
