"""Quarry Console (`quarry-console`): a web console over the routers' public gRPC API.

Its own process and port. The browser gets plain HTML/CSS/JS (static/, no build step) and a
JSON API (api.py) that translates each request into AdminClient calls, so it works against
any Quarry cluster. server.py serves both with the standard library's HTTP server.
"""
