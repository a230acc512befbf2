"""Container entry point: `python -m quarry.entrypoint router|commitlog|indexer|probe|cli|console|console-probe [args]`.

Above both the services and the clients (it starts either), so it lives at the package root:
quarry.services never imports the client package."""
from __future__ import annotations

import sys

COMMANDS = {
    "router": "quarry.services.query.__main__",
    "commitlog": "quarry.services.commitlog.__main__",
    "indexer": "quarry.services.indexer.__main__",
    "probe": "quarry.services.probe",
    "cli": "quarry.clients.cli",
    "console": "quarry.clients.console.__main__",
    "console-probe": "quarry.clients.console.probe",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(f"usage: entrypoint {{{'|'.join(COMMANDS)}}} [args…]", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(COMMANDS[args[0]])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
