"""manage.py serveadmin: the admin on this machine, with a login printed (`make admin`).

Migrates, creates (or resets the password of) a superuser, prints the address and the login,
then runs Django's development server on loopback with static files served. For a local look
at runs, plans and the library, never for production.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Serve the admin locally and print a superuser login (created or updated)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--addrport",
            default="127.0.0.1:8000",
            help="address and port to serve on (default: %(default)r)",
        )
        parser.add_argument(
            "--username",
            default="admin",
            help="superuser to create or update (default: %(default)r)",
        )
        parser.add_argument(
            "--password", default=None, help="its password (default: a new random one, printed)"
        )
        parser.add_argument(
            "--no-serve", action="store_true", help="set up the login and exit instead of serving"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        password = opts["password"] or secrets.token_urlsafe(9)
        model = get_user_model()
        user, created = model.objects.get_or_create(**{model.USERNAME_FIELD: opts["username"]})
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        host, _, port = opts["addrport"].rpartition(":")
        self.stdout.write(
            self.style.SUCCESS(f"admin:    http://{host or '127.0.0.1'}:{port}/admin/")
        )
        what = "created" if created else "password reset"
        self.stdout.write(f"login:    {user.get_username()} / {password}  ({what})")
        self.stdout.write(
            "plans:    Umt > Acquisition plans > Add starts an acquire run "
            "(with `manage.py runrelay` and `manage.py runworker` running)"
        )
        if opts["no_serve"]:
            return
        self.stdout.flush()
        call_command("runserver", opts["addrport"], use_reloader=False, insecure_serving=True)
