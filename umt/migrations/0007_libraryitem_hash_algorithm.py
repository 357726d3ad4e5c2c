# The copy records a faster hash than SHA-256 (XXH3-128) and says which: `sha256` becomes
# `content_hash`, and `hash_algorithm` is "sha256" for the rows written before.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('umt', '0006_plan_paused_status'),
    ]

    operations = [
        migrations.RenameField(
            model_name='libraryitem',
            old_name='sha256',
            new_name='content_hash',
        ),
        migrations.AlterField(
            model_name='libraryitem',
            name='content_hash',
            field=models.CharField(help_text="The file's hash (hex), verified equal to the source's.", max_length=64),
        ),
        migrations.AddField(
            model_name='libraryitem',
            name='hash_algorithm',
            field=models.CharField(default='sha256', help_text='What made content_hash: xxh3_128 (sha256 for older copies).', max_length=20),
            preserve_default=False,
        ),
    ]
