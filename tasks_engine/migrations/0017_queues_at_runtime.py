from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_engine", "0016_run_tags"),
    ]

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(default=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("reason", models.TextField(blank=True, help_text="Why it was paused.")),
                (
                    "concurrency",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Runs of the queue running at once, fleet-wide.",
                        null=True,
                    ),
                ),
                (
                    "rate_limit",
                    models.CharField(
                        blank=True,
                        help_text="Claims of the queue's runs per window: N/s, N/m, N/h.",
                        max_length=32,
                    ),
                ),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["name"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
            },
        ),
    ]
