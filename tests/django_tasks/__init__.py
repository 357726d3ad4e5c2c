"""Django's own tasks tests (tests/tasks in Django's repository), ported to DurableBackend."""
