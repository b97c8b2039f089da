"""The storage layer: every Redis key (``keys``), every client (``connection``), every Lua
script behind one typed call (``scripts`` and ``lua/``)."""
