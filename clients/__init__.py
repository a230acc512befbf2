"""The producer, the admin client and the `quarry` CLI."""

# The folder clients/ is installed as quarry.clients only: one module, one name.
if __name__ != "quarry.clients":
    raise ImportError("import quarry.clients, not clients: Quarry installs one top-level package, quarry")
