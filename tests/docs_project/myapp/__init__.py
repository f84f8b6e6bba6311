"""The example application the documentation's snippets import as "your own code".

``tests/test_docs.py`` puts ``tests/docs_project`` on ``PYTHONPATH`` for every snippet it runs,
as if this package were installed; ``prepare.py`` writes the data files snippets read."""
