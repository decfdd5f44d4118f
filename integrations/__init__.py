"""Framework integrations on the public SDK: each module records another framework's agents as runs.

They import only public ``runledger`` names (``from runledger import ...``: open, record, load,
erase and list runs with ``open_run``, ``RecordedRun``, ``load_run``, ``erase_run``, ``list_runs``), their
own modules and their framework (an extra each), never anything private, so they show what any
integration can do (``tests/unit/test_imports.py`` keeps it so). ``otel`` and ``otel_cli`` are the
exception: the OTLP exporter reads the log's subjects and the projections as the operator's
commands do.
"""
