"""gnnserve client SDK (the generated API types live in ``clients._gen``)."""
