"""The engine's hot statements as named queries (`postgresql.sql`, `sqlite.sql`), each under a
`-- name --` header and a description line, with `%(name)s` parameters. `tasks_engine.db.sql`
parses them once and looks them up by name for the database in use."""
