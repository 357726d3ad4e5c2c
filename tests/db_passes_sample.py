"""Run only by tests/test_suite_databases.py (its name is no test_*.py, so the suite does not
collect it): one test of each kind the database passes tell apart."""

import pytest


def test_unmarked() -> None:
    pass


@pytest.mark.one_db("a sample")
def test_one_db() -> None:
    pass


@pytest.mark.one_db("a sample")
class TestOneDbClass:
    def test_in_a_one_db_class(self) -> None:
        pass

    @pytest.mark.both_dbs
    def test_both_dbs_in_a_one_db_class(self) -> None:
        pass
