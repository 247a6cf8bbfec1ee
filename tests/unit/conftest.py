"""The unit tier: pure rules and the code's own shape, with no database and no Dagster
instance, in seconds (`pytest tests/unit`). tests/system/test_project.py runs it with no server
reachable to hold it so."""
