"""Tags on runs, and on PostgreSQL the index that answers `tags @> {...}` (list_runs(tags=),
the admin's tag:K=V, cancel_runs and retry_runs): GIN with jsonb_path_ops, which indexes
containment only and is a fraction of the default operator class's size, over the rows that
have tags. SQLite has no containment index; its tag filter reads each run's JSON."""

from django.db import migrations, models

INDEX = "run_tags"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX {INDEX} ON tasks_engine_workflowrun"
            " USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL"
        )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_engine", "0015_queueing_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="tags",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(create_index, drop_index),
    ]
