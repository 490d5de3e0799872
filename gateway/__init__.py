"""The running service: proxy, resolver and address guard, audit log, listeners, CLI."""
