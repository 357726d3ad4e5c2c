# The runs' primary key defaults to a version 7 UUID (tasks_engine/clock.py, new_run_id). A
# default is Python's, not the database's: state only, so that SQLite does not rebuild the runs
# table (its AlterField of a primary key copies every row into a new table) for a change with no
# SQL. Existing runs keep their uuid4 ids; both kinds live in one column.

from django.db import migrations, models

import tasks_engine.clock


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_engine", "0019_admin_action_permissions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="workflowrun",
                    name="id",
                    field=models.UUIDField(
                        default=tasks_engine.clock.new_run_id,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
            ],
        ),
    ]
