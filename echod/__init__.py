"""echod: the event store. It writes what fleetd forwards into PostgreSQL, idempotently, and
serves it back; with no database configured it runs a private PostgreSQL cluster of its own."""
